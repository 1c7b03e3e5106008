"""Report output for baton bench: text table, JSON document, PNG of
TTFT/TPOT CDFs per configuration."""

from __future__ import annotations

import json
from typing import Dict, List, Sequence

from .metrics import NOT_REPORTED, PERCENTILES, STAGES, RequestResult

SCHEMA_VERSION = 1

# Required keys of one run's report (checked by validate_run and the tests).
RUN_KEYS = ("config", "workload", "scale", "server", "summary", "metrics_delta", "requests")
SUMMARY_KEYS = ("requests_sent", "requests_completed", "requests_failed", "duration_s",
                "total_input_tokens", "total_output_tokens", "request_throughput_req_s",
                "input_throughput_tok_s", "output_throughput_tok_s", "ttft_ms", "tpot_ms",
                "itl_ms", "e2e_ms", "goodput", "stages")
DIST_KEYS = ("mean", "count") + tuple(f"p{p}" for p in PERCENTILES)


class ReportError(ValueError):
    """A report document does not follow the schema."""


def request_rows(results: Sequence[RequestResult]) -> List[dict]:
    """Per-request rows for the JSON file (times in ms)."""
    rows = []
    for r in results:
        rows.append({
            "index": r.index, "ok": r.ok, "error": r.error or None, "id": r.request_id or None,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "start_ms": r.start_s * 1000.0, "ttft_ms": r.ttft_s * 1000.0,
            "tpot_ms": r.tpot_s * 1000.0 if r.tpot_s is not None else None,
            "e2e_ms": r.e2e_s * 1000.0, "cached_tokens": r.cached_tokens,
            "itl_ms": [round(x * 1000.0, 4) for x in r.itl_s],
            "fingerprint": r.fingerprint, "record": r.record,
        })
    return rows


def row_to_result(row: dict) -> RequestResult:
    """Inverse of request_rows for one row (used to pool rounds)."""
    return RequestResult(index=row["index"], ok=row["ok"], error=row["error"] or "",
                         prompt_tokens=row["prompt_tokens"], output_tokens=row["output_tokens"],
                         ttft_s=row["ttft_ms"] / 1000.0, itl_s=[x / 1000.0 for x in row["itl_ms"]],
                         e2e_s=row["e2e_ms"] / 1000.0, start_s=row["start_ms"] / 1000.0,
                         cached_tokens=row["cached_tokens"], request_id=row["id"] or "",
                         fingerprint=row["fingerprint"], record=row["record"])


def validate_run(run: dict) -> None:
    """Raises ReportError naming the first missing/ill-typed key of a run."""
    for k in RUN_KEYS:
        if k not in run:
            raise ReportError(f"run: missing '{k}'")
    s = run["summary"]
    for k in SUMMARY_KEYS:
        if k not in s:
            raise ReportError(f"summary: missing '{k}'")
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[k]
        if d is None:
            continue
        for dk in DIST_KEYS:
            if not isinstance(d.get(dk), (int, float)):
                raise ReportError(f"summary.{k}: missing number '{dk}'")
    if not isinstance(run["requests"], list) or len(run["requests"]) != s["requests_sent"]:
        raise ReportError("requests: one row per request sent is required")
    for k in STAGES:
        if k not in s["stages"]["stages_ms"]:
            raise ReportError(f"summary.stages.stages_ms: missing '{k}'")


def validate_document(doc: dict) -> None:
    """Checks a whole JSON report (one or more runs)."""
    if doc.get("schema") != SCHEMA_VERSION:
        raise ReportError(f"schema must be {SCHEMA_VERSION}")
    if not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise ReportError("runs: a non-empty list is required")
    for r in doc["runs"]:
        validate_run(r)


def _fmt(v, unit="") -> str:
    if v is None or v == NOT_REPORTED:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3f}{unit}" if abs(v) < 100 else f"{v:.1f}{unit}"
    return f"{v}{unit}"


def format_run(run: dict) -> str:
    """The text table for one run."""
    s = run["summary"]
    md = run["metrics_delta"]
    lines = []
    w = 52

    def row(name, val):
        lines.append(f"{name:<{w}}{val}")

    title = f" baton bench: {run['config'].get('name', 'run')} "
    lines.append(title.center(w + 20, "="))
    row("Workload:", run["workload"].get("kind"))
    for k, v in (run.get("scale") or {}).items():
        row(f"  scale {k}:", _fmt(v))
    row("Requests sent:", s["requests_sent"])
    row("Requests completed:", s["requests_completed"])
    row("Requests failed:", s["requests_failed"])
    for e, n in s.get("errors", {}).items():
        row(f"  {e[:48]}:", n)
    row("Benchmark duration (s):", _fmt(s["duration_s"]))
    row("Router-counted ok requests (/metrics):", _fmt(md.get("server_requests_ok")))
    row("Total input tokens:", s["total_input_tokens"])
    row("Total output tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", _fmt(s["request_throughput_req_s"]))
    row("Input token throughput (tok/s):", _fmt(s["input_throughput_tok_s"]))
    row("Output token throughput (tok/s):", _fmt(s["output_throughput_tok_s"]))
    g = s.get("goodput")
    if g:
        row(f"Goodput (req/s, TTFT<={g['slo_ttft_ms']} ms, TPOT<={g['slo_tpot_ms']} ms):",
            _fmt(g["goodput_req_s"]))
    for k, label in (("ttft_ms", "Time to first token"), ("tpot_ms", "Time per output token (excl. 1st)"),
                     ("itl_ms", "Inter-token latency"), ("e2e_ms", "End-to-end latency")):
        lines.append(f"{'-' * 16}{label}{'-' * 16}")
        d = s[k]
        for stat in ("mean",) + tuple(f"p{p}" for p in PERCENTILES):
            row(f"{stat.capitalize() if stat == 'mean' else stat.upper()} (ms):",
                _fmt(d[stat]) if d else "n/a")
    lines.append(f"{'-' * 16}Prefix cache{'-' * 16}")
    row("Router-predicted hit rate (/metrics):", _fmt(md.get("router_predicted_hit_rate")))
    row("Worker-measured hit rate (/metrics):", _fmt(md.get("worker_measured_hit_rate")))
    row("Worker-measured hit rate (usage.cached_tokens):", _fmt(s.get("worker_measured_hit_rate_usage")))
    ideal = run["workload"].get("stats", {}).get("ideal_prefix_hit_rate")
    row("Ideal hit rate (unbounded cache, client-side):", _fmt(ideal))
    lines.append(f"{'-' * 16}Stages (per-request records){'-' * 16}")
    st = s["stages"]
    row("Requests with a stage record:", st["requests_with_record"])
    for name in STAGES:
        v = st["stages_ms"][name]
        mean_m = md.get("stage_mean_ms", {}).get(name, NOT_REPORTED)
        if isinstance(v, dict):
            row(f"{name} mean / p95 (ms):", f"{_fmt(v['mean_ms'])} / {_fmt(v['p95_ms'])}")
        else:
            row(f"{name} mean / p95 (ms):", f"n/a (/metrics mean {_fmt(mean_m)})")
    for name in STAGES:
        v = st["device_seconds_per_request"][name]
        row(f"{name} device-s per request (mean / p95):",
            f"{_fmt(v['mean_s'])} / {_fmt(v['p95_s'])}" if isinstance(v, dict) else "n/a")
    row("Device-s per request (all stages):", _fmt(st["device_seconds_total_per_request"]))
    row("Device-s per 1,000 output tokens:", _fmt(st["device_seconds_per_1k_output_tokens"]))
    if st["requests_with_record"] == 0:
        lines.append(f"(per-request stage records and device-seconds: {NOT_REPORTED})")
    fp = run["server"].get("system_fingerprints")
    row("system_fingerprint:", ", ".join(fp) if isinstance(fp, list) else "n/a")
    row("/v1/serving_config:", "recorded in JSON" if isinstance(run["server"].get("serving_config"), dict)
        else "n/a")
    ten = md.get("tenant", {})
    if isinstance(ten.get("sums"), dict):
        for k, v in ten["sums"].items():
            row(f"tenant {ten['name']} {k}:", _fmt(v))
    lines.append("=" * (w + 20))
    return "\n".join(lines)


COMPARE_FIELDS = (
    ("request_throughput_req_s", None), ("output_throughput_tok_s", None),
    ("ttft_ms", "mean"), ("ttft_ms", "p50"), ("ttft_ms", "p95"), ("ttft_ms", "p99"),
    ("tpot_ms", "mean"), ("tpot_ms", "p95"), ("itl_ms", "p95"), ("e2e_ms", "mean"), ("e2e_ms", "p95"),
)


def compare_ratios(runs: Sequence[dict]) -> Dict[str, dict]:
    """For each configuration after the first: value / first's value for the
    COMPARE_FIELDS (None where a value is missing or the base is 0)."""
    if not runs:
        return {}
    base = runs[0]["summary"]
    out = {}
    for run in runs[1:]:
        s = run["summary"]
        ratios = {}
        for k, sub in COMPARE_FIELDS:
            a, b = s.get(k), base.get(k)
            if sub is not None:
                a = a.get(sub) if isinstance(a, dict) else None
                b = b.get(sub) if isinstance(b, dict) else None
            key = f"{k}.{sub}" if sub else k
            ratios[key] = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        out[f"{run['config']['name']} / {runs[0]['config']['name']}"] = ratios
    return out


def format_ratios(ratios: Dict[str, dict]) -> str:
    lines = []
    for name, r in ratios.items():
        lines.append(f"== ratios {name} ==")
        for k, v in r.items():
            lines.append(f"  {k:<36}{'n/a' if v is None else f'{v:.3f}'}")
    return "\n".join(lines)


def write_cdf_png(path: str, runs: Sequence[dict]) -> None:
    """Two panels: empirical CDFs of TTFT and TPOT (ms) per configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        for run in runs:
            vals = np.sort([r[key] for r in run["requests"] if r["ok"] and r[key] is not None])
            if len(vals) == 0:
                continue
            y = np.arange(1, len(vals) + 1) / len(vals)
            ax.step(vals, y, where="post", label=run["config"]["name"])
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no completed requests", ha="center", transform=ax.transAxes)
    fig.suptitle("baton bench: TTFT and TPOT CDFs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(path: str, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
