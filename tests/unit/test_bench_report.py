"""baton bench: the streaming client against a small in-process OpenAI-style
SSE server (checks what is sent and what is parsed), the report's JSON
schema, the text table and the CDF chart."""
import asyncio
import json
import os
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import bench_test_path  # noqa: F401
from bench_serving import cli, client, metrics, report, workloads

GAP_S = 0.02  # the fake server's delay between tokens


class FakeServer(BaseHTTPRequestHandler):
    bodies = []
    records = {}

    def log_message(self, *a):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        elif self.path.startswith("/v1/requests/"):
            rid = self.path.rsplit("/", 1)[1]
            if rid in self.records:
                self.send_json(200, self.records[rid])
            else:
                self.send_json(404, {"error": {"message": "no such request"}})
        else:
            self.send_json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeServer.bodies.append(body)
        n = body["max_tokens"]
        idx = len(FakeServer.bodies) - 1
        rid = "cmpl-%d" % idx
        if body["prompt"][0] == 1001:  # the 'fail' request
            self.send_json(503, {"error": {"message": "overloaded", "type": "server_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        rec = {"request_id": rid, "complete": True, "e2e_ms": 100.0,
               "stages_ms": {"queue": 1.0, "prefill": 9.0, "transfer": 0.0, "decode": 90.0},
               "device_seconds": {"prefill": 0.004, "decode": 0.001 * n}}
        base = {"id": rid, "object": "text_completion", "created": 1, "model": "fake-model",
                "system_fingerprint": "fp_test"}
        for i in range(n):
            if i == 1 and body["prompt"][0] == 1002:  # the 'dies mid-stream' request
                self.wfile.write(b'data: {"error": {"message": "worker w stopped heartbeating"}}\n\n')
                self.wfile.flush()
                return
            time.sleep(GAP_S)
            chunk = dict(base, choices=[{"index": 0, "text": "x", "logprobs": None,
                                         "finish_reason": "length" if i == n - 1 else None}])
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        usage = dict(base, choices=[], usage={"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                                               "total_tokens": len(body["prompt"]) + n,
                                               "prompt_tokens_details": {"cached_tokens": 16}})
        if idx % 2 == 0:
            usage["baton"] = rec          # in the last chunk
        else:
            FakeServer.records[rid] = {"baton": rec}   # at GET /v1/requests/{id}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()


class ClientReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
        cls.base = "http://127.0.0.1:%d" % cls.httpd.server_address[1]
        cls.thread = threading.Thread(target=cls.httpd.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.httpd.shutdown()
        cls.httpd.server_close()

    def test_run_and_report(self):
        FakeServer.bodies.clear()
        reqs = workloads.random_workload(6, 20, 5, 49152, seed=2)
        reqs[3].prompt[0] = 1001  # the fake server answers this one with 503
        reqs[5].prompt[0] = 1002  # and fails this one after its first token
        for r in reqs:
            r.arrival_s = None
        cfg = client.RunConfig(base=self.base, model="fake-model", concurrency=3, progress=False)
        results, duration = asyncio.run(client.run(reqs, cfg))
        # what was sent: token ids, fixed length, ignore_eos, usage in the stream, tenant
        self.assertEqual(len(FakeServer.bodies), 6)
        sent = sorted(FakeServer.bodies, key=lambda b: b["prompt"])
        self.assertEqual(sorted(r.prompt for r in reqs), [b["prompt"] for b in sent])
        for b in FakeServer.bodies:
            self.assertEqual((b["max_tokens"], b["ignore_eos"], b["stream"]), (5, True, True))
            self.assertEqual(b["stream_options"], {"include_usage": True})
            self.assertEqual(b["user"], "baton-bench")
        self.assertEqual([r.ok for r in results], [True, True, True, False, True, False])
        self.assertTrue(results[3].error.startswith("HTTP 503"))
        self.assertEqual(results[5].error, "stream error: worker w stopped heartbeating")
        for r in (results[i] for i in (0, 1, 2, 4)):
            self.assertEqual(r.output_tokens, 5)
            self.assertEqual(len(r.itl_s), 4)
            self.assertEqual(r.cached_tokens, 16)
            self.assertEqual(r.fingerprint, "fp_test")
            # the server sleeps GAP_S before each token: TTFT and E2E are at
            # least that (a late-read chunk can make one ITL shorter, so the
            # ITLs are checked to fit inside E2E rather than one by one)
            self.assertGreaterEqual(r.ttft_s, GAP_S * 0.9)
            self.assertTrue(all(x >= 0 for x in r.itl_s))
            self.assertLessEqual(r.ttft_s + sum(r.itl_s), r.e2e_s + 1e-6)
            self.assertGreaterEqual(r.e2e_s, 5 * GAP_S * 0.9)
            self.assertIsNotNone(r.record, r.request_id)   # from the stream or the records endpoint
            self.assertEqual(r.record["stages_ms"]["decode"], 90.0)
        self.assertGreater(duration, 0)

        summ = metrics.summarize(results, duration, 1000, 1000)
        self.assertEqual(summ["stages"]["requests_with_record"], 4)
        # device-s per request: 0.004 + 0.005 = 0.009; per 1k output tokens: 4 x 0.009 s / 20 tokens x 1000 = 1.8
        self.assertAlmostEqual(summ["stages"]["device_seconds_total_per_request"], 0.009)
        self.assertAlmostEqual(summ["stages"]["device_seconds_per_1k_output_tokens"], 1.8)
        fps = summ.pop("fingerprints")
        run = {"config": {"name": "fake"}, "workload": {"kind": "random", "stats": workloads.workload_stats(reqs)},
               "scale": None, "server": {"serving_config": metrics.NOT_REPORTED, "system_fingerprints": fps},
               "summary": summ, "metrics_delta": {}, "requests": report.request_rows(results)}
        doc = {"schema": report.SCHEMA_VERSION, "runs": [run, dict(run, config={"name": "other"})]}
        report.validate_document(doc)
        doc["ratios"] = report.compare_ratios(doc["runs"])
        self.assertAlmostEqual(doc["ratios"]["other / fake"]["ttft_ms.p50"], 1.0)
        text = report.format_run(run)
        self.assertIn("Requests completed:", text)
        self.assertIn("fp_test", text)
        with tempfile.TemporaryDirectory() as d:
            report.write_json(os.path.join(d, "r.json"), doc)
            with open(os.path.join(d, "r.json")) as f:
                back = json.load(f)
            report.validate_document(back)
            self.assertEqual(back["runs"][0]["summary"]["requests_sent"], 6)
            # pooled rounds recompute the same figures from the rows
            merged = cli.merge_runs([back["runs"][0], back["runs"][0]], 1000, 1000)
            self.assertEqual(merged["summary"]["requests_sent"], 12)
            self.assertAlmostEqual(merged["summary"]["ttft_ms"]["p50"], summ["ttft_ms"]["p50"])
            report.write_cdf_png(os.path.join(d, "r.png"), doc["runs"])
            with open(os.path.join(d, "r.png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_schema_rejects(self):
        with self.assertRaises(report.ReportError):
            report.validate_document({"schema": 1, "runs": []})
        run = {k: {} for k in report.RUN_KEYS}
        with self.assertRaises(report.ReportError) as cm:
            report.validate_run(run)
        self.assertIn("summary: missing", str(cm.exception))

    def test_time_limit(self):
        # open loop: arrivals at 0 s and 5 s, limit 0.5 s: only the first is sent
        FakeServer.bodies.clear()
        reqs = workloads.random_workload(2, 4, 2, 49152, seed=3)
        reqs[0].arrival_s, reqs[1].arrival_s = 0.0, 5.0
        cfg = client.RunConfig(base=self.base, model="fake-model", time_limit_s=0.5, progress=False)
        t = time.perf_counter()
        results, _ = asyncio.run(client.run(reqs, cfg))
        self.assertLess(time.perf_counter() - t, 3.0)
        self.assertEqual(len(results), 1)
        self.assertTrue(results[0].ok)

    def test_cluster_config_threads(self):
        from bench_serving import cluster
        c = cluster.ClusterConfig.parse("colocated:threads=2")
        self.assertTrue(c.colocated)
        self.assertEqual(c.threads, 2)
        self.assertEqual(c.as_dict()["threads"], 2)
        self.assertNotIn("threads", cluster.ClusterConfig.parse("disagg").as_dict())
        cl = cluster.Cluster(c, "model.gguf", None, threads=1)
        self.assertEqual(cl.threads, 2)  # the configuration's own count wins
        self.assertEqual(cluster.Cluster(cluster.ClusterConfig.parse("disagg"), "m", None,
                                         threads=1).threads, 1)
        with self.assertRaises(ValueError):
            cluster.ClusterConfig.parse("colocated:threads=0")

    def test_connection_refused(self):
        reqs = workloads.random_workload(1, 4, 2, 49152)
        cfg = client.RunConfig(base="http://127.0.0.1:9", model="m", concurrency=1, progress=False)
        results, duration = asyncio.run(client.run(reqs, cfg))
        self.assertFalse(results[0].ok)
        self.assertTrue(results[0].error.startswith("connection"), results[0].error)
        self.assertEqual(duration, 0.0)


if __name__ == "__main__":
    unittest.main()
