"""baton bench: Mooncake trace loader and synthetic workloads.

Expected lengths are worked out by hand from tests/data/bench_trace_small.jsonl
and the scaling rule (scaled input = ceil(input_length * block_tokens / 512),
capped; output = min(max(1, round(output_length * output_scale)), cap);
arrival = timestamp / 1000 * time_scale)."""
import os
import tempfile
import unittest

import bench_test_path  # noqa: F401
from bench_serving import arrivals, workloads
from bench_serving.workloads import TraceScale, WorkloadError

TRACE = os.path.join(bench_test_path.DATA, "bench_trace_small.jsonl")
V = 49152


class TraceTest(unittest.TestCase):
    def load(self, **kw):
        sc = TraceScale(**dict(dict(block_tokens=16, max_input_len=40, output_scale=0.5,
                                    max_output_len=64, time_scale=0.5), **kw))
        return workloads.load_mooncake_trace(TRACE, sc, V)

    def test_scaling(self):
        reqs = self.load()
        # 1200*16/512 = 37.5 -> 38; 1024 -> 32; 600 -> 18.75 -> 19; 1536 -> 48 capped to 40; 100 -> 3.125 -> 4
        self.assertEqual([len(r.prompt) for r in reqs], [38, 32, 19, 40, 4])
        # round(10*0.5)=5; round(1.5)=2 (banker's rounding); 0 -> 1; 100 -> capped 64; round(2.5)=2
        self.assertEqual([r.max_tokens for r in reqs], [5, 2, 1, 64, 2])
        self.assertEqual([r.arrival_s for r in reqs], [0.0, 0.25, 0.5, 1.25, 2.0])
        for r in reqs:
            self.assertTrue(all(1000 <= t < V for t in r.prompt))

    def test_request_count_and_start(self):
        reqs = self.load(num_requests=2, start=2)
        self.assertEqual(len(reqs), 2)
        self.assertEqual([len(r.prompt) for r in reqs], [19, 40])
        # arrivals are relative to the first request used: (1000, 2500) ms * 0.5
        self.assertEqual([r.arrival_s for r in reqs], [0.0, 0.75])

    def test_same_ids_same_prefix(self):
        a = self.load()
        b = self.load()
        self.assertEqual([r.prompt for r in a], [r.prompt for r in b])
        # requests 0, 1 and 3 start with hash ids [0, 1]: a 32-token common prefix
        self.assertEqual(a[0].prompt[:32], a[1].prompt)
        self.assertEqual(a[3].prompt[:32], a[1].prompt)
        # and then differ (ids 2 vs 9)
        self.assertNotEqual(a[0].prompt[32:38], a[3].prompt[32:38])
        # id 8 is block 1 of request 2 and block 0 of request 4: same tokens at any position
        self.assertEqual(a[2].prompt[16:19], a[4].prompt[:3])
        self.assertEqual(a[4].prompt, workloads.hash_block_tokens(8, 16, V)[:4])
        # a different block size keeps a different but still deterministic run
        c = self.load(block_tokens=8)
        self.assertEqual(c[0].prompt[:16], c[1].prompt[:16])

    def test_distinct_ids_differ(self):
        runs = [tuple(workloads.hash_block_tokens(i, 16, V)) for i in range(50)]
        self.assertEqual(len(set(runs)), 50)

    def bad(self, text, needle):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write(text)
        try:
            with self.assertRaises(WorkloadError) as cm:
                workloads.load_mooncake_trace(f.name, TraceScale(), V)
            self.assertIn(needle, str(cm.exception))
        finally:
            os.unlink(f.name)

    def test_bad_traces(self):
        self.bad('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n{oops\n',
                 "line 2: not JSON")
        self.bad('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0]}\n',
                 "expected ceil(1024/512) = 2")
        self.bad('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n', "timestamp")
        self.bad('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-3]}\n', "hash_ids")
        self.bad('[1, 2]\n', "not a JSON object")
        self.bad('', "no requests")
        with self.assertRaises(WorkloadError):
            workloads.load_mooncake_trace("/nonexistent/trace.jsonl", TraceScale(), V)

    def test_shared_trace_file_parses(self):
        path = os.path.abspath(os.path.join(bench_test_path.SOURCE, "..", "shared", "traces",
                                            "mooncake_synthetic_trace.jsonl"))
        if not os.path.exists(path):
            self.skipTest("shared Mooncake trace not present")
        reqs = workloads.load_mooncake_trace(path, TraceScale(num_requests=200), V)
        self.assertEqual(len(reqs), 200)
        self.assertTrue(all(len(r.prompt) <= 2048 for r in reqs))
        self.assertEqual(reqs[0].arrival_s, 0.0)


class SyntheticTest(unittest.TestCase):
    def test_shared_prefix(self):
        reqs = workloads.shared_prefix_workload(2, 3, 32, 16, 7, V, seed=1)
        self.assertEqual(len(reqs), 6)
        self.assertEqual([r.group for r in reqs], [0, 1, 0, 1, 0, 1])
        self.assertTrue(all(len(r.prompt) == 48 and r.max_tokens == 7 for r in reqs))
        self.assertEqual(reqs[0].prompt[:32], reqs[2].prompt[:32])
        self.assertNotEqual(reqs[0].prompt[:32], reqs[1].prompt[:32])
        self.assertNotEqual(reqs[0].prompt[32:], reqs[2].prompt[32:])
        # ideal block-16 hit rate: 2 groups x 2 later requests x 32 shared tokens / (6 x 48)
        st = workloads.workload_stats(reqs, 16)
        self.assertAlmostEqual(st["ideal_prefix_hit_rate"], 128 / 288)
        self.assertEqual(st["prompt_tokens"], 288)
        self.assertEqual(st["output_tokens"], 42)

    def test_shared_prefix_shuffle(self):
        a = workloads.shared_prefix_workload(2, 3, 32, 16, 7, V, seed=1)
        b = workloads.shared_prefix_workload(2, 3, 32, 16, 7, V, seed=1, shuffle=True)
        self.assertEqual(sorted(r.prompt for r in a), sorted(r.prompt for r in b))
        self.assertEqual([r.index for r in b], list(range(6)))
        c = workloads.shared_prefix_workload(2, 3, 32, 16, 7, V, seed=1, shuffle=True)
        self.assertEqual([r.prompt for r in b], [r.prompt for r in c])

    def test_random(self):
        a = workloads.random_workload(4, 10, 3, V, seed=5)
        b = workloads.random_workload(4, 10, 3, V, seed=5)
        self.assertEqual([r.prompt for r in a], [r.prompt for r in b])
        self.assertEqual(workloads.workload_stats(a)["ideal_prefix_hit_rate"], 0.0)
        with self.assertRaises(WorkloadError):
            workloads.random_workload(0, 10, 3, V)

    def test_arrivals(self):
        reqs = workloads.random_workload(2000, 1, 1, V)
        arrivals.assign_arrivals(reqs, "poisson", rate=4.0, seed=3)
        gaps = [b.arrival_s - a.arrival_s for a, b in zip(reqs, reqs[1:])]
        self.assertEqual(reqs[0].arrival_s, 0.0)
        self.assertTrue(all(g >= 0 for g in gaps))
        # mean gap of an exponential(1/4 s) sample of 1999: within 10% of 0.25 s
        self.assertAlmostEqual(sum(gaps) / len(gaps), 0.25, delta=0.025)
        arrivals.assign_arrivals(reqs, "concurrency")
        self.assertIsNone(reqs[0].arrival_s)
        with self.assertRaises(WorkloadError):
            arrivals.assign_arrivals(reqs, "trace")
        with self.assertRaises(WorkloadError):
            arrivals.assign_arrivals(reqs, "poisson", rate=0)


if __name__ == "__main__":
    unittest.main()
