"""baton bench command line (scripts/baton-bench)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shlex
import sys
from typing import List, Optional

import httpx2 as httpx  # the HTTP client the openai package is built on

from . import arrivals, client, cluster, metrics, report, server, workloads

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_TRACE = os.path.abspath(os.path.join(SOURCE, "..", "shared", "traces",
                                             "mooncake_synthetic_trace.jsonl"))

HELP_EPILOG = """\
metric definitions (the same as vLLM's benchmark_serving and SGLang's bench_serving):
  TTFT   request sent -> first streamed chunk carrying a choice
  ITL    gap between consecutive streamed chunks carrying a choice
  TPOT   (e2e - ttft) / (output_tokens - 1), requests with > 1 output token
  E2E    request sent -> end of the stream
  throughputs are totals over the run (first send -> last completion);
  goodput counts completed requests meeting every given SLO (a one-token
  request counts TPOT 0); percentiles use linear interpolation.
  Output token counts are the server's usage.completion_tokens.

server-side figures (stage means/p95, device-seconds, hit rates, tenant sums,
system_fingerprint, /v1/serving_config) come from the server when it reports
them and are printed as "n/a" / "not reported by the server" otherwise; see
scripts/bench_serving/server.py for the fields read.

examples:
  scripts/baton-bench --workload mooncake --num-requests 200 --time-scale 0.5
  scripts/baton-bench --workload shared-prefix --groups 8 --per-group 8 \\
      --system-len 1024 --question-len 64 --output-len 32 --arrival poisson --rate 4
  scripts/baton-bench --workload random --num-requests 50 --input-len 256 \\
      --output-len 32 --concurrency 8 --slo-ttft-ms 500 --slo-tpot-ms 50
  scripts/baton-bench --compare cache_aware:prefill=2 round_robin:prefill=2 \\
      --build-dir build --workload mooncake --num-requests 100
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="baton-bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serving benchmark for baton: replays a trace or a synthetic workload "
                    "against the OpenAI HTTP API (/v1/completions, token-id prompts, streamed, "
                    "ignore_eos) and reports throughput, TTFT/TPOT/ITL/E2E, goodput, prefix-cache "
                    "hit rates and per-stage time and device-seconds.",
        epilog=HELP_EPILOG)
    g = p.add_argument_group("target")
    g.add_argument("--endpoint", default="http://127.0.0.1:8000", help="router base URL (default %(default)s)")
    g.add_argument("--allow-remote", action="store_true", help="allow a non-loopback endpoint")
    g.add_argument("--model", help="model id (default: the first of GET /v1/models)")
    g.add_argument("--api-key", default=os.environ.get("BATON_API_KEY", "baton-bench"))
    g.add_argument("--tenant", default="baton-bench", help="sent as the OpenAI 'user' field")
    g.add_argument("--request-timeout-s", type=float, default=600.0)

    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=("mooncake", "shared-prefix", "random"), default="mooncake")
    w.add_argument("--num-requests", type=int, default=0,
                   help="requests to send (mooncake: first N of the trace, 0 = all; random: default 100; "
                        "shared-prefix: cap on groups x per-group)")
    w.add_argument("--seed", type=int, default=0, help="seed for synthetic prompts and Poisson gaps")
    w.add_argument("--vocab-size", type=int, default=49152,
                   help="prompt token ids are drawn from [--token-low, vocab) (default %(default)s: SmolLM2)")
    w.add_argument("--token-low", type=int, default=1000)
    w.add_argument("--trace", default=DEFAULT_TRACE, help="Mooncake JSONL trace (default %(default)s)")
    w.add_argument("--trace-start", type=int, default=0, help="first trace line used (0-based)")
    w.add_argument("--block-tokens", type=int, default=16,
                   help="tokens per trace hash block (trace: 512; length scale = this / 512)")
    w.add_argument("--max-input-len", type=int, default=2048, help="cap on scaled prompt length")
    w.add_argument("--output-scale", type=float, default=1.0, help="multiplies trace output lengths")
    w.add_argument("--max-output-len", type=int, default=64, help="cap on scaled output length")
    w.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies trace timestamps (0.5 = twice as fast)")
    w.add_argument("--groups", type=int, default=8)
    w.add_argument("--per-group", type=int, default=8)
    w.add_argument("--system-len", type=int, default=1024)
    w.add_argument("--question-len", type=int, default=64)
    w.add_argument("--shuffle", action="store_true",
                   help="shared-prefix: seeded random order instead of interleaving the groups")
    w.add_argument("--input-len", type=int, default=256, help="random: prompt length")
    w.add_argument("--output-len", type=int, default=32, help="random / shared-prefix: output length")

    a = p.add_argument_group("arrivals and bounds")
    a.add_argument("--arrival", choices=arrivals.MODES,
                   help="default: trace for mooncake, poisson when --rate is given, else concurrency")
    a.add_argument("--rate", type=float, default=0.0, help="Poisson rate, requests/s")
    a.add_argument("--concurrency", type=int, default=8, help="requests in flight (closed loop)")
    a.add_argument("--time-limit-s", type=float, default=0.0,
                   help="stop sending new requests after this many seconds (0 = none)")
    a.add_argument("--drain-s", type=float, default=60.0,
                   help="after the time limit, wait this long for requests in flight, then cancel them")

    r = p.add_argument_group("report")
    r.add_argument("--slo-ttft-ms", type=float)
    r.add_argument("--slo-tpot-ms", type=float)
    r.add_argument("--output-json", help="JSON report path (default bench-results/baton-bench-<time>.json)")
    r.add_argument("--no-png", action="store_true", help="do not write the CDF chart beside the JSON")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--no-records", action="store_true", help="do not GET /v1/requests/{id}")

    c = p.add_argument_group("compare (starts a cluster per configuration)")
    c.add_argument("--compare", nargs="+", metavar="CONFIG",
                   help="configurations NAME or NAME:policy=P,prefill=N,decode=N,colocated=1; presets "
                        "cache_aware, round_robin, least_loaded, colocated, disagg")
    c.add_argument("--rounds", type=int, default=1, help="alternate the configurations this many times")
    c.add_argument("--launcher", choices=("binaries", "baton-up"), default="binaries")
    c.add_argument("--build-dir", default=os.environ.get("BATON_BINARY_DIR", os.path.join(SOURCE, "build")))
    c.add_argument("--cluster-model", default=os.path.expanduser("~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf"))
    c.add_argument("--threads", type=int, default=2, help="threads per worker")
    c.add_argument("--kv-blocks", type=int, default=4096, help="KV pool blocks per worker")
    c.add_argument("--router-args", default="", help="extra baton-router options (one string, shell-split)")
    return p


def make_workload(args) -> tuple:
    """(requests, workload description, scale dict or None)."""
    if args.workload == "mooncake":
        sc = workloads.TraceScale(block_tokens=args.block_tokens, max_input_len=args.max_input_len,
                                  output_scale=args.output_scale, max_output_len=args.max_output_len,
                                  time_scale=args.time_scale, num_requests=args.num_requests,
                                  start=args.trace_start)
        reqs = workloads.load_mooncake_trace(args.trace, sc, args.vocab_size, args.token_low)
        desc = {"kind": "mooncake", "trace": args.trace}
        scale = sc.as_dict()
    elif args.workload == "shared-prefix":
        reqs = workloads.shared_prefix_workload(args.groups, args.per_group, args.system_len,
                                                args.question_len, args.output_len, args.vocab_size,
                                                args.seed, args.token_low, args.shuffle)
        if args.num_requests:
            reqs = reqs[:args.num_requests]
        desc = {"kind": "shared-prefix", "groups": args.groups, "per_group": args.per_group,
                "system_len": args.system_len, "question_len": args.question_len,
                "output_len": args.output_len, "shuffle": args.shuffle}
        scale = None
    else:
        n = args.num_requests or 100
        reqs = workloads.random_workload(n, args.input_len, args.output_len, args.vocab_size,
                                         args.seed, args.token_low)
        desc = {"kind": "random", "input_len": args.input_len, "output_len": args.output_len}
        scale = None
    mode = args.arrival or ("trace" if args.workload == "mooncake" else
                            "poisson" if args.rate > 0 else "concurrency")
    arrivals.assign_arrivals(reqs, mode, args.rate, args.seed)
    desc["arrival"] = mode
    if mode == "poisson":
        desc["rate_req_s"] = args.rate
    if mode == "concurrency":
        desc["concurrency"] = args.concurrency
    desc["stats"] = workloads.workload_stats(reqs)
    return reqs, desc, scale


async def run_once(args, base: str, reqs, desc, scale, config: dict) -> dict:
    """One benchmark run against base; returns the run's report dict."""
    model = args.model or await client.first_model(base)
    if not model:
        raise RuntimeError(f"GET {base}/v1/models gave no model; pass --model")
    async with httpx.AsyncClient() as http:
        serving_config = await server.get_json(http, base + "/v1/serving_config")
        before = await server.scrape_metrics(http, base)
    rc = client.RunConfig(base=base, model=model,
                          concurrency=args.concurrency if desc["arrival"] == "concurrency" else 0,
                          time_limit_s=args.time_limit_s, drain_s=args.drain_s,
                          request_timeout_s=args.request_timeout_s, tenant=args.tenant,
                          api_key=args.api_key, fetch_records=not args.no_records,
                          progress=not args.no_progress and sys.stderr.isatty())
    results, duration = await client.run(reqs, rc)
    async with httpx.AsyncClient() as http:
        after = await server.scrape_metrics(http, base)
    summ = metrics.summarize(results, duration, args.slo_ttft_ms, args.slo_tpot_ms)
    return {
        "config": dict(config, endpoint=base, model=model),
        "workload": desc,
        "scale": scale,
        "server": {
            "serving_config": serving_config if serving_config is not None else metrics.NOT_REPORTED,
            "system_fingerprints": summ.pop("fingerprints"),
            "metrics_endpoint": before is not None,
        },
        "summary": summ,
        "metrics_delta": server.metrics_delta_summary(before, after, args.tenant),
        "requests": report.request_rows(results),
    }


def merge_runs(runs: List[dict], slo_ttft_ms, slo_tpot_ms) -> dict:
    """Pools the rounds of one configuration into one run (every request
    row kept, tagged with its round; the summary recomputed from the rows
    over the summed durations; each round's own summary kept in 'rounds')."""
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[0])
    rows = [dict(r, round=i) for i, run in enumerate(runs) for r in run["requests"]]
    res = [report.row_to_result(row) for row in rows]
    summ = metrics.summarize(res, sum(r["summary"]["duration_s"] for r in runs), slo_ttft_ms, slo_tpot_ms)
    summ.pop("fingerprints")
    merged["summary"] = summ
    merged["requests"] = rows
    merged["rounds"] = [{"summary": r["summary"], "metrics_delta": r["metrics_delta"]} for r in runs]
    return merged


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        reqs, desc, scale = make_workload(args)
    except workloads.WorkloadError as e:
        print(f"baton-bench: {e}", file=sys.stderr)
        return 2
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_json = args.output_json or os.path.join("bench-results", f"baton-bench-{stamp}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    runs: List[dict] = []
    if args.compare:
        try:
            cfgs = [cluster.ClusterConfig.parse(s) for s in args.compare]
        except ValueError as e:
            print(f"baton-bench: {e}", file=sys.stderr)
            return 2
        per: dict = {c.name: [] for c in cfgs}
        for rnd in range(max(1, args.rounds)):
            for c in cfgs:
                print(f"baton-bench: round {rnd + 1}, configuration {c.name}: starting the cluster",
                      file=sys.stderr)
                cl = cluster.Cluster(c, args.cluster_model, args.build_dir, args.launcher,
                                     args.threads, args.kv_blocks,
                                     router_args=shlex.split(args.router_args))
                try:
                    cl.start()
                    run = asyncio.run(run_once(args, cl.base, reqs, desc, scale, c.as_dict()))
                except cluster.ClusterError as e:
                    print(f"baton-bench: {e}", file=sys.stderr)
                    return 1
                finally:
                    cl.stop()
                run["config"]["logs"] = cl.logdir
                per[c.name].append(run)
        runs = [merge_runs(per[c.name], args.slo_ttft_ms, args.slo_tpot_ms) for c in cfgs]
    else:
        try:
            base = server.check_endpoint(args.endpoint, args.allow_remote)
        except server.EndpointError as e:
            print(f"baton-bench: {e}", file=sys.stderr)
            return 2
        try:
            runs = [asyncio.run(run_once(args, base, reqs, desc, scale, {"name": "run"}))]
        except RuntimeError as e:
            print(f"baton-bench: {e}", file=sys.stderr)
            return 1
    doc = {"schema": report.SCHEMA_VERSION, "tool": "baton-bench",
           "started": stamp, "argv": sys.argv[1:] if argv is None else argv, "runs": runs}
    if len(runs) > 1:
        doc["ratios"] = report.compare_ratios(runs)
    report.validate_document(doc)
    for run in runs:
        print(report.format_run(run))
    if "ratios" in doc:
        print(report.format_ratios(doc["ratios"]))
    report.write_json(out_json, doc)
    print(f"baton-bench: JSON report {out_json}")
    if not args.no_png:
        png = os.path.splitext(out_json)[0] + ".png"
        report.write_cdf_png(png, runs)
        print(f"baton-bench: CDF chart {png}")
    failed = sum(r["summary"]["requests_failed"] for r in runs)
    return 0 if failed == 0 else 3
