"""Workloads for baton bench: each yields a list of BenchRequest.

Three sources:

* Mooncake trace (JSONL: ``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids`` with one id per 512-token block; format described in
  /work/shared/traces/README.md and the Mooncake paper, FAST '25).  Each hash
  id maps to a fixed run of ``block_tokens`` token ids drawn from a PCG64
  generator seeded with the id alone, so the same id yields the same tokens at
  any position in any request, and requests that share leading ids share a
  token prefix.  Lengths are scaled by ``block_tokens / 512`` and capped;
  arrival times are multiplied by ``time_scale``.
* Synthetic shared prefix: ``groups`` x ``per_group`` requests; each group has
  one system prompt of ``system_len`` tokens, each request adds its own
  ``question_len`` tokens and asks for ``output_len`` tokens.
* Fixed-length random prompts.

All prompts are token-id lists in ``[token_low, vocab_size)`` (token_low skips
the low ids where GGUF vocabularies keep their special tokens).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in the Mooncake trace format


class WorkloadError(ValueError):
    """A workload file or parameter is invalid (message names the cause)."""


@dataclass
class BenchRequest:
    """One request to send: token-id prompt, fixed output length, arrival.

    arrival_s is the offset from the start of the run (trace/Poisson) or None
    (fixed concurrency: send as soon as a slot is free)."""

    index: int
    prompt: List[int]
    max_tokens: int
    arrival_s: Optional[float] = None
    group: Optional[int] = None
    hash_ids: List[int] = field(default_factory=list)


@dataclass
class TraceScale:
    """The stated scale factors applied to a Mooncake trace."""

    block_tokens: int = 16          # tokens per hash block (trace: 512)
    max_input_len: int = 2048       # cap on the scaled prompt length, tokens
    output_scale: float = 1.0       # multiplies output_length
    max_output_len: int = 64        # cap on the scaled output length
    time_scale: float = 1.0         # multiplies trace timestamps
    num_requests: int = 0           # 0 = all requests of the trace
    start: int = 0                  # first trace line used (0-based)

    def as_dict(self) -> dict:
        return {
            "tokens_per_hash_block": self.block_tokens,
            "trace_tokens_per_hash_block": MOONCAKE_BLOCK_TOKENS,
            "length_scale": self.block_tokens / MOONCAKE_BLOCK_TOKENS,
            "max_input_len": self.max_input_len,
            "output_scale": self.output_scale,
            "max_output_len": self.max_output_len,
            "time_scale": self.time_scale,
            "num_requests": self.num_requests,
            "start": self.start,
        }


def hash_block_tokens(hash_id: int, block_tokens: int, vocab_size: int,
                      token_low: int = 1000) -> List[int]:
    """Token ids for one hash id: block_tokens ids in [token_low, vocab_size)
    from numpy's PCG64 seeded with the hash id only (deterministic across
    runs, positions and requests)."""
    if hash_id < 0:
        raise WorkloadError(f"hash id {hash_id} is negative")
    if not 0 <= token_low < vocab_size:
        raise WorkloadError(f"token range [{token_low}, {vocab_size}) is empty")
    rng = np.random.Generator(np.random.PCG64(hash_id))
    return rng.integers(token_low, vocab_size, size=block_tokens).tolist()


def _check_int(obj: dict, key: str, lineno: int, minimum: int = 0) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise WorkloadError(f"trace line {lineno}: '{key}' must be an integer >= {minimum}")
    return v


def load_mooncake_trace(path: str, scale: TraceScale, vocab_size: int,
                        token_low: int = 1000) -> List[BenchRequest]:
    """Reads a Mooncake JSONL trace and returns scaled requests.

    For each line (after ``scale.start``, at most ``scale.num_requests``):
    scaled input length = min(ceil(input_length * block_tokens / 512),
    max_input_len); the prompt is the concatenation of the hash ids' token
    runs, cut to that length (so the last block may be partial, as in the
    trace); max_tokens = min(max(1, round(output_length * output_scale)),
    max_output_len); arrival = timestamp_ms / 1000 * time_scale, relative to
    the first request used.  Raises WorkloadError on a malformed line."""
    if scale.block_tokens < 1 or scale.max_input_len < 1 or scale.max_output_len < 1:
        raise WorkloadError("block_tokens, max_input_len and max_output_len must be >= 1")
    if scale.time_scale < 0 or scale.output_scale <= 0:
        raise WorkloadError("time_scale must be >= 0 and output_scale > 0")
    out: List[BenchRequest] = []
    cache: dict = {}
    t0 = None
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise WorkloadError(f"cannot open trace {path}: {e.strerror}") from e
    with f:
        lineno = 0
        for line in f:
            lineno += 1
            if not line.strip():
                continue
            if lineno - 1 < scale.start:
                continue
            if scale.num_requests and len(out) >= scale.num_requests:
                break
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"trace line {lineno}: not JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise WorkloadError(f"trace line {lineno}: not a JSON object")
            ts = obj.get("timestamp")
            if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
                raise WorkloadError(f"trace line {lineno}: 'timestamp' must be a number >= 0")
            in_len = _check_int(obj, "input_length", lineno, 1)
            out_len = _check_int(obj, "output_length", lineno, 0)
            ids = obj.get("hash_ids")
            if not isinstance(ids, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise WorkloadError(f"trace line {lineno}: 'hash_ids' must be a list of integers >= 0")
            if len(ids) != math.ceil(in_len / MOONCAKE_BLOCK_TOKENS):
                raise WorkloadError(
                    f"trace line {lineno}: {len(ids)} hash_ids for input_length {in_len} "
                    f"(expected ceil({in_len}/512) = {math.ceil(in_len / MOONCAKE_BLOCK_TOKENS)})")
            n_in = min(math.ceil(in_len * scale.block_tokens / MOONCAKE_BLOCK_TOKENS),
                       scale.max_input_len)
            prompt: List[int] = []
            for h in ids:
                if len(prompt) >= n_in:
                    break
                run = cache.get(h)
                if run is None:
                    run = hash_block_tokens(h, scale.block_tokens, vocab_size, token_low)
                    cache[h] = run
                prompt.extend(run)
            del prompt[n_in:]
            n_out = min(max(1, int(round(out_len * scale.output_scale))), scale.max_output_len)
            if t0 is None:
                t0 = float(ts)
            out.append(BenchRequest(index=len(out), prompt=prompt, max_tokens=n_out,
                                    arrival_s=(float(ts) - t0) / 1000.0 * scale.time_scale,
                                    hash_ids=list(ids)))
    if not out:
        raise WorkloadError(f"trace {path}: no requests selected")
    return out


def shared_prefix_workload(groups: int, per_group: int, system_len: int,
                           question_len: int, output_len: int, vocab_size: int,
                           seed: int = 0, token_low: int = 1000,
                           shuffle: bool = False) -> List[BenchRequest]:
    """groups x per_group requests; request j of group g has prompt
    system[g] + question[g, j].  Requests are interleaved across groups
    (g0q0, g1q0, ..., g0q1, ...), or in a seeded random order with shuffle
    (interleaving lets round-robin over a divisor of `groups` workers keep
    every group on one worker).  Deterministic in seed."""
    if min(groups, per_group, output_len) < 1 or system_len < 0 or question_len < 0 \
            or system_len + question_len < 1:
        raise WorkloadError("shared-prefix: groups, per-group, output length >= 1 and a "
                            "non-empty prompt are required")
    rng = np.random.Generator(np.random.PCG64(seed))
    systems = [rng.integers(token_low, vocab_size, size=system_len).tolist() for _ in range(groups)]
    out: List[BenchRequest] = []
    for j in range(per_group):
        for g in range(groups):
            q = rng.integers(token_low, vocab_size, size=question_len).tolist()
            out.append(BenchRequest(index=len(out), prompt=systems[g] + q,
                                    max_tokens=output_len, group=g))
    if shuffle:
        order = rng.permutation(len(out))
        out = [out[i] for i in order]
        for i, r in enumerate(out):
            r.index = i
    return out


def random_workload(num_requests: int, input_len: int, output_len: int, vocab_size: int,
                    seed: int = 0, token_low: int = 1000) -> List[BenchRequest]:
    """num_requests prompts of input_len uniformly random token ids each."""
    if min(num_requests, input_len, output_len) < 1:
        raise WorkloadError("random: num-requests, input-len and output-len must be >= 1")
    rng = np.random.Generator(np.random.PCG64(seed))
    return [BenchRequest(index=i, prompt=rng.integers(token_low, vocab_size, size=input_len).tolist(),
                         max_tokens=output_len) for i in range(num_requests)]


def workload_stats(reqs: Iterable[BenchRequest], block_size: int = 16) -> dict:
    """Prompt/output length totals and the ideal prefix-cache hit rate: the
    fraction of prompt tokens in full blocks of block_size whose whole prefix
    (this block and all before it) an earlier request already sent, i.e. what
    an unbounded block-granular prefix cache could reuse."""
    reqs = list(reqs)
    n_in = sum(len(r.prompt) for r in reqs)
    seen = set()
    reusable = 0
    for r in reqs:
        h = 0
        hit = True
        for b in range(len(r.prompt) // block_size):
            h = hash((h, tuple(r.prompt[b * block_size:(b + 1) * block_size])))
            if hit and h in seen:
                reusable += block_size
            else:
                hit = False
                seen.add(h)
    return {
        "requests": len(reqs),
        "prompt_tokens": n_in,
        "output_tokens": sum(r.max_tokens for r in reqs),
        "mean_prompt_len": n_in / len(reqs) if reqs else 0.0,
        "ideal_prefix_hit_rate": reusable / n_in if n_in else 0.0,
        "ideal_hit_block_size": block_size,
    }
