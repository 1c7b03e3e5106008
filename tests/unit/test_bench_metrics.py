"""baton bench: percentile, TPOT, goodput, stage and /metrics arithmetic
against values worked out by hand (in the comments)."""
import unittest

import bench_test_path  # noqa: F401
from bench_serving import metrics, server
from bench_serving.metrics import NOT_REPORTED, RequestResult


def results():
    # r0: ttft 100 ms, e2e 1000 ms, 10 tokens -> TPOT (1000-100)/9 = 100 ms; ITLs 100 ms x 9
    # r1: ttft 300 ms, e2e 500 ms, 5 tokens  -> TPOT 200/4 = 50 ms; ITLs 50 ms x 4
    # r2: ttft 50 ms, e2e 50 ms, 1 token     -> no TPOT (counts 0 for goodput)
    # r3: failed
    return [
        RequestResult(index=0, ok=True, prompt_tokens=100, output_tokens=10, ttft_s=0.1,
                      itl_s=[0.1] * 9, e2e_s=1.0, cached_tokens=40,
                      record={"e2e_ms": 1000.0, "stages_ms": {"queue": 10, "prefill": 90, "transfer": 5,
                                                              "decode": 890},
                              "device_seconds": {"prefill": 0.08, "decode": 0.02}}),
        RequestResult(index=1, ok=True, prompt_tokens=60, output_tokens=5, ttft_s=0.3,
                      itl_s=[0.05] * 4, e2e_s=0.5, cached_tokens=0,
                      record={"e2e_ms": 500.0, "stages_ms": {"queue": 200, "prefill": 80, "transfer": 20,
                                                             "decode": 150},
                              "device_seconds": {"prefill": 0.06, "decode": 0.01}}),
        RequestResult(index=2, ok=True, prompt_tokens=40, output_tokens=1, ttft_s=0.05, e2e_s=0.05,
                      cached_tokens=20),
        RequestResult(index=3, ok=False, error="HTTP 503: busy", prompt_tokens=10),
    ]


class PercentileTest(unittest.TestCase):
    def test_distribution(self):
        d = metrics.distribution(list(range(1, 11)))
        # linear interpolation at rank p/100 * (n-1): p50 -> 4.5 -> 5.5; p90 -> 8.1 -> 9.1;
        # p95 -> 8.55 -> 9.55; p99 -> 8.91 -> 9.91
        self.assertAlmostEqual(d["mean"], 5.5)
        self.assertAlmostEqual(d["p50"], 5.5)
        self.assertAlmostEqual(d["p90"], 9.1)
        self.assertAlmostEqual(d["p95"], 9.55)
        self.assertAlmostEqual(d["p99"], 9.91)
        self.assertEqual(d["count"], 10)
        # scale: seconds -> ms
        d = metrics.distribution([0.002, 0.004], 1000.0)
        self.assertAlmostEqual(d["mean"], 3.0)
        self.assertAlmostEqual(d["p90"], 3.8)  # 2 + 0.9 * 2
        self.assertIsNone(metrics.distribution([]))
        d = metrics.distribution([7.0])
        self.assertEqual((d["p50"], d["p99"]), (7.0, 7.0))

    def test_tpot(self):
        r = results()
        self.assertAlmostEqual(r[0].tpot_s, 0.1)
        self.assertAlmostEqual(r[1].tpot_s, 0.05)
        self.assertIsNone(r[2].tpot_s)


class GoodputTest(unittest.TestCase):
    def test_goodput(self):
        r = results()
        # both SLOs 200 ms / 80 ms: r0 fails TPOT (100), r1 fails TTFT (300), r2 passes -> 1 / 2 s
        g = metrics.goodput(r, 2.0, 200, 80)
        self.assertEqual(g["good_requests"], 1)
        self.assertAlmostEqual(g["goodput_req_s"], 0.5)
        self.assertAlmostEqual(g["good_fraction"], 0.25)
        # TTFT only 200 ms: r0, r2 -> 2 / 2 s = 1.0
        self.assertAlmostEqual(metrics.goodput(r, 2.0, 200, None)["goodput_req_s"], 1.0)
        # TPOT only 80 ms: r1, r2 -> 1.0; TPOT 100 ms: r0 (100 <= 100), r1, r2 -> 1.5
        self.assertAlmostEqual(metrics.goodput(r, 2.0, None, 80)["goodput_req_s"], 1.0)
        self.assertAlmostEqual(metrics.goodput(r, 2.0, None, 100)["goodput_req_s"], 1.5)
        self.assertIsNone(metrics.goodput(r, 2.0, None, None))


class SummaryTest(unittest.TestCase):
    def test_summary(self):
        s = metrics.summarize(results(), 2.0, 200, 80)
        self.assertEqual((s["requests_sent"], s["requests_completed"], s["requests_failed"]), (4, 3, 1))
        self.assertEqual(s["errors"], {"HTTP 503: busy": 1})
        # 3 completed / 2 s; input 100+60+40 = 200 -> 100 tok/s; output 16 -> 8 tok/s
        self.assertAlmostEqual(s["request_throughput_req_s"], 1.5)
        self.assertAlmostEqual(s["input_throughput_tok_s"], 100.0)
        self.assertAlmostEqual(s["output_throughput_tok_s"], 8.0)
        # TTFT ms [100, 300, 50]: mean 150, p50 100; TPOT [100, 50] mean 75
        self.assertAlmostEqual(s["ttft_ms"]["mean"], 150.0)
        self.assertAlmostEqual(s["ttft_ms"]["p50"], 100.0)
        self.assertAlmostEqual(s["tpot_ms"]["mean"], 75.0)
        self.assertEqual(s["tpot_ms"]["count"], 2)
        # ITL: nine 100 ms + four 50 ms = 1100 / 13
        self.assertAlmostEqual(s["itl_ms"]["mean"], 1100.0 / 13)
        self.assertEqual(s["itl_ms"]["count"], 13)
        # E2E [1000, 500, 50]: mean 516.67, p90 rank 1.8 -> 500 + 0.8 * 500 = 900
        self.assertAlmostEqual(s["e2e_ms"]["p90"], 900.0)
        # cached 40+0+20 of 200 prompt tokens
        self.assertAlmostEqual(s["worker_measured_hit_rate_usage"], 0.3)

    def test_stages(self):
        st = metrics.stage_summary(results())
        self.assertEqual(st["requests_with_record"], 2)
        # queue [10, 200]: mean 105, p95 rank 0.95 -> 10 + 0.95 * 190 = 190.5
        self.assertAlmostEqual(st["stages_ms"]["queue"]["mean_ms"], 105.0)
        self.assertAlmostEqual(st["stages_ms"]["queue"]["p95_ms"], 190.5)
        self.assertAlmostEqual(st["stages_ms"]["decode"]["mean_ms"], 520.0)
        # device-s: prefill [0.08, 0.06] mean 0.07; totals [0.10, 0.07] mean 0.085;
        # per 1k output tokens: 0.17 s / 15 tokens * 1000 = 11.333
        self.assertAlmostEqual(st["device_seconds_per_request"]["prefill"]["mean_s"], 0.07)
        self.assertEqual(st["device_seconds_per_request"]["queue"], NOT_REPORTED)
        self.assertAlmostEqual(st["device_seconds_total_per_request"], 0.085)
        self.assertAlmostEqual(st["device_seconds_per_1k_output_tokens"], 0.17 / 15 * 1000)
        none = metrics.stage_summary([RequestResult(index=0, ok=True, output_tokens=3)])
        self.assertEqual(none["stages_ms"]["prefill"], NOT_REPORTED)
        self.assertEqual(none["device_seconds_per_1k_output_tokens"], NOT_REPORTED)

    def test_stage_sum(self):
        r = results()
        # r0: 10+90+5+890 = 995 vs 1000 -> 0.5 %; r1: 450 vs 500 -> 10 %
        self.assertAlmostEqual(metrics.stage_sum_mismatch(r[0].record), 0.005)
        self.assertAlmostEqual(metrics.stage_sum_mismatch(r[1].record), 0.1)
        self.assertIsNone(metrics.stage_sum_mismatch({"stages_ms": {"queue": 1}}))


BEFORE = """# TYPE baton_router_predicted_hit_blocks_total counter
baton_router_predicted_hit_blocks_total 10
# TYPE baton_router_prompt_blocks_total counter
baton_router_prompt_blocks_total 100
# TYPE baton_router_measured_cached_tokens_total counter
baton_router_measured_cached_tokens_total 160
# TYPE baton_router_measured_prompt_tokens_total counter
baton_router_measured_prompt_tokens_total 1600
# TYPE baton_router_stage_seconds histogram
baton_router_stage_seconds_bucket{stage="queue",le="+Inf"} 4
baton_router_stage_seconds_sum{stage="queue"} 0.5
baton_router_stage_seconds_count{stage="queue"} 4
"""
AFTER = """# TYPE baton_router_predicted_hit_blocks_total counter
baton_router_predicted_hit_blocks_total 40
# TYPE baton_router_prompt_blocks_total counter
baton_router_prompt_blocks_total 200
# TYPE baton_router_measured_cached_tokens_total counter
baton_router_measured_cached_tokens_total 560
# TYPE baton_router_measured_prompt_tokens_total counter
baton_router_measured_prompt_tokens_total 3200
# TYPE baton_router_stage_seconds histogram
baton_router_stage_seconds_bucket{stage="queue",le="+Inf"} 14
baton_router_stage_seconds_sum{stage="queue"} 1.5
baton_router_stage_seconds_count{stage="queue"} 14
# TYPE baton_router_tenant_requests_total counter
baton_router_tenant_requests_total{tenant="t1"} 10
"""


class MetricsDeltaTest(unittest.TestCase):
    def test_delta(self):
        d = server.metrics_delta_summary(server.parse_metrics(BEFORE), server.parse_metrics(AFTER), "t1")
        # predicted (40-10)/(200-100) = 0.3; measured (560-160)/(3200-1600) = 0.25
        self.assertAlmostEqual(d["router_predicted_hit_rate"], 0.3)
        self.assertAlmostEqual(d["worker_measured_hit_rate"], 0.25)
        # queue: 1.0 s over 10 requests -> 100 ms
        self.assertAlmostEqual(d["stage_mean_ms"]["queue"], 100.0)
        self.assertEqual(d["stage_mean_ms"]["decode"], NOT_REPORTED)
        self.assertEqual(d["tenant"]["sums"], {"requests_total": 10.0})
        self.assertEqual(d["transfer_bytes"], NOT_REPORTED)
        none = server.metrics_delta_summary(None, None, "t1")
        self.assertEqual(none["router_predicted_hit_rate"], NOT_REPORTED)
        self.assertEqual(none["tenant"]["sums"], NOT_REPORTED)


class EndpointTest(unittest.TestCase):
    def test_loopback_only(self):
        self.assertEqual(server.check_endpoint("http://127.0.0.1:8000/", False), "http://127.0.0.1:8000")
        self.assertEqual(server.check_endpoint("http://localhost:9", False), "http://localhost:9")
        with self.assertRaises(server.EndpointError) as cm:
            server.check_endpoint("http://10.1.2.3:8000", False)
        self.assertIn("--allow-remote", str(cm.exception))
        self.assertEqual(server.check_endpoint("http://10.1.2.3:8000", True), "http://10.1.2.3:8000")
        with self.assertRaises(server.EndpointError):
            server.check_endpoint("127.0.0.1:8000", False)


if __name__ == "__main__":
    unittest.main()
