"""Arrival processes for baton bench (open loop for rates, closed loop for
concurrency).

* ``trace``: keep each request's own (scaled) trace timestamp.
* ``poisson``: exponential inter-arrival gaps with mean 1/rate seconds (a
  Poisson process of the given rate, as vLLM's benchmark_serving draws it);
  the first request is sent at t = 0.  Deterministic in seed.
* ``concurrency``: no timestamps; the runner keeps N requests in flight.
"""

from __future__ import annotations

from typing import List

import numpy as np

from .workloads import BenchRequest, WorkloadError

MODES = ("trace", "poisson", "concurrency")


def assign_arrivals(reqs: List[BenchRequest], mode: str, rate: float = 0.0,
                    seed: int = 0) -> None:
    """Sets arrival_s on every request for the given mode (in place).

    trace: every request must already carry arrival_s (a trace workload).
    poisson: rate > 0 requests per second.  concurrency: arrival_s = None.
    Raises WorkloadError on a bad combination."""
    if mode == "trace":
        if any(r.arrival_s is None for r in reqs):
            raise WorkloadError("--arrival trace needs a trace workload (requests carry no timestamps)")
    elif mode == "poisson":
        if not rate > 0:
            raise WorkloadError("--arrival poisson needs --rate > 0 (requests per second)")
        rng = np.random.Generator(np.random.PCG64(seed))
        gaps = rng.exponential(1.0 / rate, size=len(reqs))
        t = 0.0
        for i, r in enumerate(reqs):
            r.arrival_s = t
            t += float(gaps[i])
    elif mode == "concurrency":
        for r in reqs:
            r.arrival_s = None
    else:
        raise WorkloadError(f"unknown arrival mode '{mode}' (one of {', '.join(MODES)})")
