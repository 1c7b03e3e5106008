"""What baton bench reads from the server besides the token stream.

Per-request stage record (the ``baton`` object), looked for, in order, in
the last SSE chunk of a stream (``chunk["baton"]``) and at
``GET /v1/requests/{id}`` (id = the response id, ``cmpl-...``)::

    {"request_id": "cmpl-...", "complete": true,
     "e2e_ms": 812.4,                       # router arrival -> finish
     "stages_ms": {"queue": 3.1, "prefill": 80.2, "transfer": 4.0, "decode": 720.9},
     "device_seconds": {"prefill": 0.071, "decode": 0.013},
     "prefix_cache": {"prompt_tokens": 2048, "predicted_hit_tokens": 1024,
                      "cached_tokens": 1024}}

Router /metrics (Prometheus text), read before and after a run; deltas:
``baton_router_predicted_hit_blocks_total`` / ``baton_router_prompt_blocks_total``
(router-predicted hit rate), ``baton_router_measured_cached_tokens_total`` /
``baton_router_measured_prompt_tokens_total`` (worker-measured hit rate),
``baton_router_stage_seconds_{sum,count}{stage=...}`` (stage means),
``baton_router_tenant_*_total{tenant=...}`` (per-tenant sums).

``GET /v1/serving_config`` (the serving configuration) and the responses'
``system_fingerprint`` are recorded as they are.  Anything absent is
reported as "not reported by the server", never estimated.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Dict, Optional, Tuple
from urllib.parse import urlparse

import httpx2 as httpx  # the HTTP client the openai package is built on
from prometheus_client.parser import text_string_to_metric_families

from .metrics import NOT_REPORTED, STAGES


class EndpointError(ValueError):
    """The endpoint is malformed or not allowed."""


def check_endpoint(url: str, allow_remote: bool) -> str:
    """Returns the endpoint without a trailing slash; refuses a host that
    does not resolve only to loopback addresses unless allow_remote."""
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise EndpointError(f"endpoint '{url}' must look like http://127.0.0.1:8000")
    if not allow_remote:
        try:
            addrs = {ai[4][0] for ai in socket.getaddrinfo(u.hostname, u.port or 80)}
        except socket.gaierror as e:
            raise EndpointError(f"cannot resolve '{u.hostname}': {e}") from e
        bad = [a for a in addrs if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
        if bad:
            raise EndpointError(f"endpoint host '{u.hostname}' is not loopback ({', '.join(sorted(bad))}); "
                                "pass --allow-remote to target it")
    return url.rstrip("/")


MetricKey = Tuple[str, Tuple[Tuple[str, str], ...]]


def parse_metrics(text: str) -> Dict[MetricKey, float]:
    """Prometheus text -> {(sample name, sorted labels): value}."""
    out: Dict[MetricKey, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


async def scrape_metrics(client: httpx.AsyncClient, base: str) -> Optional[Dict[MetricKey, float]]:
    """GET /metrics parsed, or None when unavailable."""
    try:
        r = await client.get(base + "/metrics", timeout=10.0)
        if r.status_code != 200:
            return None
        return parse_metrics(r.text)
    except (httpx.HTTPError, ValueError):
        return None


async def get_json(client: httpx.AsyncClient, url: str) -> Optional[dict]:
    """GET url as JSON object, or None on any non-200 / non-object."""
    try:
        r = await client.get(url, timeout=10.0)
        if r.status_code != 200:
            return None
        v = r.json()
        return v if isinstance(v, dict) else None
    except (httpx.HTTPError, ValueError):
        return None


def _delta(before, after, name, labels=()) -> Optional[float]:
    k = (name, tuple(sorted(labels)))
    if before is None or after is None or k not in after:
        return None
    return after[k] - before.get(k, 0.0)


def metrics_delta_summary(before, after, tenant: str) -> dict:
    """Run-level figures from the /metrics counters' change over the run."""
    out: Dict[str, object] = {}
    pb = _delta(before, after, "baton_router_prompt_blocks_total")
    hb = _delta(before, after, "baton_router_predicted_hit_blocks_total")
    out["router_predicted_hit_rate"] = hb / pb if pb and hb is not None else NOT_REPORTED
    mp = _delta(before, after, "baton_router_measured_prompt_tokens_total")
    mc = _delta(before, after, "baton_router_measured_cached_tokens_total")
    out["worker_measured_hit_rate"] = mc / mp if mp and mc is not None else NOT_REPORTED
    stages = {}
    for s in STAGES:
        su = _delta(before, after, "baton_router_stage_seconds_sum", (("stage", s),))
        c = _delta(before, after, "baton_router_stage_seconds_count", (("stage", s),))
        stages[s] = su / c * 1000.0 if c and su is not None else NOT_REPORTED
    out["stage_mean_ms"] = stages
    for key, name, labels in (("requests_ok", "baton_router_requests_total", (("outcome", "ok"),)),
                              ("prompt_tokens", "baton_router_prompt_tokens_total", ()),
                              ("completion_tokens", "baton_router_completion_tokens_total", ())):
        v = _delta(before, after, name, labels)
        out[f"server_{key}"] = v if v is not None else NOT_REPORTED
    tb = _delta(before, after, "baton_router_transfer_bytes_total")
    out["transfer_bytes"] = tb if tb is not None else NOT_REPORTED
    ten = {}
    if after is not None:
        for (name, labels) in after:
            if name.startswith("baton_router_tenant_") and dict(labels).get("tenant") == tenant:
                key = name[len("baton_router_tenant_"):]
                ten[key] = _delta(before, after, name, labels)
    out["tenant"] = {"name": tenant, "sums": ten or NOT_REPORTED}
    return out
