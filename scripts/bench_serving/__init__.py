"""baton bench: serving benchmark for the baton cluster (issue 6).

Modules: workloads (Mooncake trace loader, shared-prefix and random
workloads), arrivals (trace / Poisson / concurrency), client (async
streaming OpenAI client), metrics (TTFT/TPOT/ITL/E2E, goodput, stages),
server (what is read from the router besides the stream), report (table,
JSON, PNG), cluster (start/stop a local cluster for --compare), cli."""
