"""baton bench end to end (issue 6): 50 requests through scripts/baton-bench
against a real local cluster (baton-router + 1 baton-prefill + 1
baton-decode from $BATON_BINARY_DIR, or scripts/baton-up when no build
folder is given), then checks that

* the report counts equal the requests sent (client side and the router's
  own /metrics counters), every request completed with its fixed length;
* every request carries the server's stage record, and its stage times
  (queue + prefill + transfer + decode) add up to its end-to-end latency
  within 5 %.

Fails with a clear message when a binary is missing or when the server does
not report per-request stage records."""
import json
import os
import subprocess
import sys
import tempfile

SOURCE = os.environ.get("BATON_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
from bench_serving import cluster, metrics  # noqa: E402

N_GROUPS, PER_GROUP, OUT_LEN = 5, 10, 4
SYSTEM_LEN, QUESTION_LEN = 32, 16  # small: the test build is ASan/UBSan on 2 cores
N = N_GROUPS * PER_GROUP


def fail(msg):
    print("test_bench_e2e: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    build = os.environ.get("BATON_BINARY_DIR")
    model = os.environ.get("BATON_MODEL") or os.path.expanduser("~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        fail(f"default model missing: {model} (run scripts/fetch-model)")
    launcher = "binaries" if build else "baton-up"
    cfg = cluster.ClusterConfig(name="disagg-1p1d", policy="cache_aware", prefill=1, decode=1)
    # The test build is ASan/UBSan (-O1): a worker's forward step can outlast the
    # router's default 3 s heartbeat timeout, so the test allows 30 s.
    cl = cluster.Cluster(cfg, model, build, launcher, threads=2, kv_blocks=1024,
                         router_args=["--worker-timeout-ms", "30000"])
    try:
        if launcher == "binaries":
            for sub, name in (("router", "baton-router"), ("prefill_worker", "baton-prefill"),
                              ("decode_worker", "baton-decode")):
                p = os.path.join(build, sub, name)
                if not os.access(p, os.X_OK):
                    fail(f"{name} binary missing: {p} (the cluster is not built yet)")
        try:
            cl.start(ready_timeout_s=120)
        except cluster.ClusterError as e:
            fail(f"cluster did not start: {e}")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "report.json")
            cmd = [os.path.join(SOURCE, "scripts", "baton-bench"), "--endpoint", cl.base,
                   "--workload", "shared-prefix", "--groups", str(N_GROUPS), "--per-group", str(PER_GROUP),
                   "--system-len", str(SYSTEM_LEN), "--question-len", str(QUESTION_LEN), "--output-len", str(OUT_LEN),
                   "--concurrency", "4", "--no-progress", "--output-json", out,
                   "--slo-ttft-ms", "5000", "--slo-tpot-ms", "1000", "--request-timeout-s", "120"]
            env = dict(os.environ, BATON_PYTHON=sys.executable)
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=240)
            print(p.stdout)
            if not os.path.exists(out):
                fail(f"baton-bench wrote no report (exit {p.returncode})")
            with open(out) as f:
                doc = json.load(f)
            if os.path.exists(os.path.splitext(out)[0] + ".png") is False:
                fail("no PNG chart beside the JSON")
        run = doc["runs"][0]
        s = run["summary"]
        if s["requests_sent"] != N or len(run["requests"]) != N:
            fail(f"report counts {s['requests_sent']} requests sent, {len(run['requests'])} rows; sent {N}")
        if s["requests_completed"] != N:
            dead = [f"{name} exited {pr.returncode}:\n{cl.log(name)[-1500:]}"
                    for name, pr, _ in cl.procs if pr.poll() is not None]
            fail(f"{s['requests_failed']} of {N} requests failed: {s['errors']} (cluster logs in {cl.logdir})"
                 + ("\n" + "\n".join(dead) if dead else ""))
        if s["total_output_tokens"] != N * OUT_LEN:
            fail(f"output tokens {s['total_output_tokens']} != {N} x {OUT_LEN} (ignore_eos fixed length)")
        if s["total_input_tokens"] != N * (SYSTEM_LEN + QUESTION_LEN):
            fail(f"input tokens {s['total_input_tokens']} != {N} x {SYSTEM_LEN + QUESTION_LEN}")
        md = run["metrics_delta"]
        if md.get("server_requests_ok") not in (float(N), metrics.NOT_REPORTED):
            fail(f"router /metrics counted {md.get('server_requests_ok')} ok requests, the client {N}")
        if md.get("server_completion_tokens") not in (float(N * OUT_LEN), metrics.NOT_REPORTED):
            fail(f"router /metrics counted {md.get('server_completion_tokens')} completion tokens")
        missing = [r["index"] for r in run["requests"] if not r["record"]]
        if missing:
            fail(f"{len(missing)} of {N} requests have no per-request stage record: the router must report "
                 "'baton': {request_id, complete, e2e_ms, stages_ms{queue,prefill,transfer,decode}, "
                 "device_seconds{...}} in the last SSE chunk or at GET /v1/requests/{id} "
                 "(scripts/bench_serving/server.py)")
        bad = []
        for r in run["requests"]:
            rec = r["record"]
            for st in metrics.STAGES:
                if not isinstance(rec.get("stages_ms", {}).get(st), (int, float)):
                    fail(f"request {r['index']}: stage record lacks stages_ms.{st}: {rec}")
            mis = metrics.stage_sum_mismatch(rec)
            if mis is None:
                fail(f"request {r['index']}: stage record lacks e2e_ms: {rec}")
            if mis > 0.05:
                bad.append((r["index"], round(mis * 100, 2)))
        if bad:
            fail(f"stage times do not add up to end-to-end latency within 5 % for {len(bad)} requests: {bad[:10]}")
        print(f"test_bench_e2e: OK: {N} requests, {N * OUT_LEN} output tokens, stage sums within 5 %")
    finally:
        codes = cl.stop()
        print(f"test_bench_e2e: stopped {codes}", file=sys.stderr)


if __name__ == "__main__":
    main()
