"""Async streaming client: sends BenchRequests to an OpenAI-compatible
/v1/completions endpoint (token-id prompts, fixed output lengths through
``ignore_eos``) with the official ``openai`` package and records per-chunk
timestamps, usage and the server's stage records."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import List, Optional

import httpx2 as httpx  # the HTTP client the openai package is built on
import openai
from tqdm import tqdm

from .metrics import RequestResult
from .server import get_json
from .workloads import BenchRequest


@dataclass
class RunConfig:
    base: str                       # http://127.0.0.1:8000 (no /v1)
    model: str
    concurrency: int = 0            # > 0: closed loop with this many in flight
    time_limit_s: float = 0.0       # 0 = none: stop sending new requests after it
    drain_s: float = 60.0           # then wait this long for in-flight requests
    request_timeout_s: float = 600.0
    tenant: str = "baton-bench"     # sent as the OpenAI `user` field
    api_key: str = "baton-bench"
    temperature: float = 0.0
    fetch_records: bool = True      # GET /v1/requests/{id} when the stream has no record
    progress: bool = True


def _error_message(e: openai.APIStatusError) -> str:
    """The OpenAI-style error.message of a status error's body, else the
    client's own text."""
    b = e.body
    if isinstance(b, dict) and isinstance(b.get("error"), dict):
        b = b["error"]
    if isinstance(b, dict) and isinstance(b.get("message"), str):
        return b["message"]
    return str(e.message)


class _Records:
    """Remembers whether the server has a records endpoint at all."""

    def __init__(self) -> None:
        self.absent = False


async def _fetch_record(http: httpx.AsyncClient, base: str, rid: str, state: _Records) -> Optional[dict]:
    if state.absent or not rid:
        return None
    for attempt in range(20):
        try:
            r = await http.get(f"{base}/v1/requests/{rid}", timeout=5.0)
        except httpx.HTTPError:
            return None
        if r.status_code in (404, 405, 501):
            # no records endpoint (or the record is gone): stop asking for the rest of the run
            state.absent = True
            return None
        if r.status_code != 200:
            return None
        try:
            rec = r.json()
        except ValueError:
            return None
        if isinstance(rec, dict) and isinstance(rec.get("baton"), dict):
            rec = rec["baton"]
        if not isinstance(rec, dict):
            return None
        if rec.get("complete", True):
            return rec
        await asyncio.sleep(0.05)
    return None


async def _one(cli: openai.AsyncOpenAI, http: httpx.AsyncClient, cfg: RunConfig,
               req: BenchRequest, t0: float, rec_state: _Records) -> RequestResult:
    res = RequestResult(index=req.index, prompt_tokens=len(req.prompt))
    st = time.perf_counter()
    res.start_s = st - t0
    last = st
    got_first = False
    record = None
    try:
        stream = await cli.completions.create(
            model=cfg.model, prompt=req.prompt, max_tokens=req.max_tokens,
            temperature=cfg.temperature, stream=True, stream_options={"include_usage": True},
            user=cfg.tenant, extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.id:
                res.request_id = chunk.id
            if chunk.system_fingerprint:
                res.fingerprint = chunk.system_fingerprint
            extra = chunk.model_extra or {}
            if isinstance(extra.get("baton"), dict):
                record = extra["baton"]
            if chunk.choices:
                if not got_first:
                    got_first = True
                    res.ttft_s = now - st
                else:
                    res.itl_s.append(now - last)
                last = now
            if chunk.usage is not None:
                res.output_tokens = chunk.usage.completion_tokens
                det = chunk.usage.prompt_tokens_details
                if det is not None and det.cached_tokens is not None:
                    res.cached_tokens = det.cached_tokens
        res.e2e_s = time.perf_counter() - st
        if not got_first:
            res.error = "stream ended without a token"
        elif res.output_tokens == 0:
            res.error = "no usage in the stream (stream_options.include_usage ignored)"
        else:
            res.ok = True
    except openai.APIStatusError as e:
        res.error = f"HTTP {e.status_code}: {_error_message(e)[:100]}"
    except openai.APITimeoutError:
        res.error = "timeout"
    except openai.APIConnectionError as e:
        res.error = f"connection: {str(e)[:120]}"
    except openai.APIError as e:  # an error event in the middle of the stream
        res.error = f"stream error: {str(e.message)[:100]}"
        res.e2e_s = time.perf_counter() - st
    except (httpx.HTTPError, ValueError) as e:
        res.error = f"client: {type(e).__name__}: {str(e)[:100]}"
    except asyncio.CancelledError:
        res.error = "cancelled at the time limit"
        res.e2e_s = time.perf_counter() - st
        return res
    if res.ok and record is None and cfg.fetch_records:
        record = await _fetch_record(http, cfg.base, res.request_id, rec_state)
    res.record = record
    return res


async def run(reqs: List[BenchRequest], cfg: RunConfig) -> tuple:
    """Sends every request (open loop at arrival_s, or closed loop with
    cfg.concurrency in flight) and returns (results in request order,
    duration_s from the first send to the last completion)."""
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
    http = httpx.AsyncClient(limits=limits)
    cli = openai.AsyncOpenAI(base_url=cfg.base + "/v1", api_key=cfg.api_key, max_retries=0,
                             timeout=httpx.Timeout(cfg.request_timeout_s, connect=10.0),
                             http_client=httpx.AsyncClient(limits=limits))
    rec_state = _Records()
    bar = tqdm(total=len(reqs), unit="req", disable=not cfg.progress, dynamic_ncols=True)
    tasks: List[asyncio.Task] = []
    t0 = time.perf_counter()
    deadline = t0 + cfg.time_limit_s if cfg.time_limit_s > 0 else None
    sem = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency > 0 else None

    async def guarded(r: BenchRequest) -> RequestResult:
        try:
            return await _one(cli, http, cfg, r, t0, rec_state)
        except Exception as e:  # anything unforeseen fails this request, not the run
            return RequestResult(index=r.index, prompt_tokens=len(r.prompt),
                                 error=f"client: {type(e).__name__}: {str(e)[:100]}")
        finally:
            if sem is not None:
                sem.release()
            bar.update(1)

    try:
        for r in reqs:
            if sem is not None:
                await sem.acquire()
            elif r.arrival_s is not None:
                delay = t0 + r.arrival_s - time.perf_counter()
                if deadline is not None and t0 + r.arrival_s > deadline:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
            if deadline is not None and time.perf_counter() > deadline:
                if sem is not None:
                    sem.release()
                break
            tasks.append(asyncio.create_task(guarded(r)))
        wait_s = None
        if deadline is not None:
            wait_s = max(0.0, deadline - time.perf_counter()) + cfg.drain_s
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=wait_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending)
        results = [t.result() for t in tasks]
    finally:
        bar.close()
        await cli.close()
        await http.aclose()
    ends = [r.start_s + r.e2e_s for r in results if r.ok]
    starts = [r.start_s for r in results]
    duration = (max(ends) - min(starts)) if ends else 0.0
    return results, duration


async def first_model(base: str) -> Optional[str]:
    """The first model id of GET /v1/models, or None."""
    async with httpx.AsyncClient() as http:
        v = await get_json(http, base + "/v1/models")
    try:
        return v["data"][0]["id"]
    except (TypeError, KeyError, IndexError):
        return None
