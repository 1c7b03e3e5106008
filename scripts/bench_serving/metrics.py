"""Metric arithmetic for baton bench.

Definitions follow vLLM's benchmarks/benchmark_serving.py and SGLang's
bench_serving.py:

* TTFT: request sent -> first streamed chunk that carries a choice.
* ITL: the gap between consecutive streamed chunks that carry a choice.
* TPOT: (e2e - ttft) / (output_tokens - 1), only for requests with more than
  one output token.
* E2E: request sent -> end of the stream.
* Throughputs: totals over the benchmark duration (first send to last
  completion).
* Goodput: completed requests per second that meet every given SLO
  (TTFT <= --slo-ttft-ms, TPOT <= --slo-tpot-ms; a one-token request counts
  TPOT 0, as vLLM does).
* Percentiles: numpy.percentile with linear interpolation (numpy's default,
  as both benchmarks use).

Server-side stage records (see server.py for the schema) give per-request
queue / prefill / transfer / decode times and device-seconds; these are
summarised only when the server reports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

PERCENTILES = (50, 90, 95, 99)
STAGES = ("queue", "prefill", "transfer", "decode")
NOT_REPORTED = "not reported by the server"


@dataclass
class RequestResult:
    """What the client saw for one request (times in seconds)."""

    index: int
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0           # sent prompt length
    output_tokens: int = 0           # usage.completion_tokens (server count)
    ttft_s: float = 0.0
    itl_s: List[float] = field(default_factory=list)
    e2e_s: float = 0.0
    start_s: float = 0.0             # send time, from the start of the run
    cached_tokens: Optional[int] = None   # usage.prompt_tokens_details.cached_tokens
    request_id: str = ""
    fingerprint: Optional[str] = None
    record: Optional[dict] = None    # the server's stage record, when reported

    @property
    def tpot_s(self) -> Optional[float]:
        if self.output_tokens > 1:
            return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
        return None


def distribution(values: Sequence[float], scale: float = 1.0) -> Optional[dict]:
    """mean and p50/p90/p95/p99 (linear interpolation) of values * scale, or
    None when values is empty."""
    if len(values) == 0:
        return None
    a = np.asarray(values, dtype=np.float64) * scale
    out = {"mean": float(a.mean()), "count": int(a.size)}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(a, p))
    return out


def goodput(results: Sequence[RequestResult], duration_s: float,
            slo_ttft_ms: Optional[float], slo_tpot_ms: Optional[float]) -> Optional[dict]:
    """Requests per second (over duration_s) of completed requests meeting all
    the given SLOs; None when no SLO is given."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        return None
    good = 0
    for r in results:
        if not r.ok:
            continue
        if slo_ttft_ms is not None and r.ttft_s * 1000.0 > slo_ttft_ms:
            continue
        tpot = r.tpot_s if r.tpot_s is not None else 0.0
        if slo_tpot_ms is not None and tpot * 1000.0 > slo_tpot_ms:
            continue
        good += 1
    return {
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "good_requests": good,
        "goodput_req_s": good / duration_s if duration_s > 0 else 0.0,
        "good_fraction": good / len(results) if results else 0.0,
    }


def stage_summary(results: Sequence[RequestResult]) -> dict:
    """Per-stage means/p95 (ms) and device-seconds from the server's
    per-request records.  Keys whose data no request carried are
    NOT_REPORTED."""
    ok = [r for r in results if r.ok]
    recs = [r for r in ok if r.record]
    out: Dict[str, object] = {"requests_with_record": len(recs)}
    stages: Dict[str, object] = {}
    for s in STAGES:
        vals = [float(r.record["stages_ms"][s]) for r in recs
                if isinstance(r.record.get("stages_ms"), dict)
                and isinstance(r.record["stages_ms"].get(s), (int, float))]
        d = distribution(vals)
        stages[s] = {"mean_ms": d["mean"], "p95_ms": d["p95"], "count": d["count"]} if d else NOT_REPORTED
    out["stages_ms"] = stages
    dev: Dict[str, object] = {}
    totals = []
    out_tok = 0
    for r in recs:
        ds = r.record.get("device_seconds")
        if isinstance(ds, dict) and ds and all(isinstance(v, (int, float)) for v in ds.values()):
            totals.append(float(sum(ds.values())))
            out_tok += r.output_tokens
    for s in STAGES:
        vals = [float(r.record["device_seconds"][s]) for r in recs
                if isinstance(r.record.get("device_seconds"), dict)
                and isinstance(r.record["device_seconds"].get(s), (int, float))]
        d = distribution(vals)
        dev[s] = {"mean_s": d["mean"], "p95_s": d["p95"]} if d else NOT_REPORTED
    out["device_seconds_per_request"] = dev
    if totals:
        out["device_seconds_total_per_request"] = float(np.mean(totals))
        out["device_seconds_per_1k_output_tokens"] = (
            sum(totals) / out_tok * 1000.0 if out_tok else NOT_REPORTED)
    else:
        out["device_seconds_total_per_request"] = NOT_REPORTED
        out["device_seconds_per_1k_output_tokens"] = NOT_REPORTED
    return out


def stage_sum_mismatch(record: dict) -> Optional[float]:
    """|sum(stages_ms) - e2e_ms| / e2e_ms for one record, or None when the
    record lacks stages or e2e_ms."""
    st = record.get("stages_ms") if isinstance(record, dict) else None
    e2e = record.get("e2e_ms") if isinstance(record, dict) else None
    if not isinstance(st, dict) or not st or not isinstance(e2e, (int, float)) or e2e <= 0:
        return None
    total = sum(float(v) for v in st.values() if isinstance(v, (int, float)))
    return abs(total - float(e2e)) / float(e2e)


def summarize(results: Sequence[RequestResult], duration_s: float,
              slo_ttft_ms: Optional[float] = None, slo_tpot_ms: Optional[float] = None) -> dict:
    """The client-side report: counts, throughputs, latency distributions
    (ms), goodput, per-request worker-measured prefix-cache hits and stage
    attribution."""
    ok = [r for r in results if r.ok]
    in_tok = sum(r.prompt_tokens for r in ok)
    out_tok = sum(r.output_tokens for r in ok)
    itl = [x for r in ok for x in r.itl_s]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    errors: Dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    cached = [r for r in ok if r.cached_tokens is not None]
    rep = {
        "requests_sent": len(results),
        "requests_completed": len(ok),
        "requests_failed": len(results) - len(ok),
        "errors": errors,
        "duration_s": duration_s,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput_req_s": len(ok) / duration_s if duration_s > 0 else 0.0,
        "input_throughput_tok_s": in_tok / duration_s if duration_s > 0 else 0.0,
        "output_throughput_tok_s": out_tok / duration_s if duration_s > 0 else 0.0,
        "ttft_ms": distribution([r.ttft_s for r in ok], 1000.0),
        "tpot_ms": distribution(tpots, 1000.0),
        "itl_ms": distribution(itl, 1000.0),
        "e2e_ms": distribution([r.e2e_s for r in ok], 1000.0),
        "goodput": goodput(results, duration_s, slo_ttft_ms, slo_tpot_ms),
        "worker_measured_hit_rate_usage": (
            sum(r.cached_tokens for r in cached) / sum(r.prompt_tokens for r in cached)
            if cached and sum(r.prompt_tokens for r in cached) else NOT_REPORTED),
        "fingerprints": sorted({r.fingerprint for r in ok if r.fingerprint}) or NOT_REPORTED,
    }
    rep["stages"] = stage_summary(results)
    return rep
