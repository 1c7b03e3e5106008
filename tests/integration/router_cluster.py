"""Starts a local baton cluster for the router's integration tests and
benchmarks: baton-router plus either the real workers (baton-prefill,
baton-decode, or baton-worker --role both) or the fake worker pair
(tests/integration/fake_worker.py), every process on 127.0.0.1 with free
ports, logs in a temporary folder. Everything started is stopped by
Cluster.stop() (SIGTERM, then SIGKILL after a grace period)."""
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))


_libc = ctypes.CDLL("libc.so.6", use_errno=True)
PR_SET_PDEATHSIG = 1


def _child_setup():
    # own process group (stop() signals the group), and SIGTERM when the
    # test driver dies, even by SIGKILL (a ctest timeout): no orphans
    os.setsid()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def default_model():
    if os.environ.get("BATON_MODEL"):
        return os.environ["BATON_MODEL"]
    d = os.environ.get("BATON_MODEL_DIR", os.path.expanduser("~/.cache/baton"))
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def http(method, url, body=None, headers=None, timeout=30):
    """Returns (status, body bytes); never raises on HTTP error statuses."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def parse_metrics(text):
    """Prometheus text -> {name{labels}: float}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


class Cluster:
    def __init__(self, build, workers="real", n_prefill=1, n_decode=1, colocated=False,
                 policy="cache_aware", threads=2, router_args=(), model=None, kv_blocks=1024,
                 hash_seed=12345, fake_args=(), logdir=None):
        self.build = build
        self.workers = workers
        self.n_prefill = n_prefill
        self.n_decode = n_decode
        self.colocated = colocated
        self.policy = policy
        self.threads = threads
        self.router_args = list(router_args)
        self.model = model or default_model()
        self.kv_blocks = kv_blocks
        self.hash_seed = hash_seed
        self.fake_args = list(fake_args)
        self.logdir = logdir or tempfile.mkdtemp(prefix="baton-router-test-")
        self.procs = []
        self.http_port = free_port()
        self.control = "tcp://127.0.0.1:%d" % free_port()
        self.base = "http://127.0.0.1:%d" % self.http_port

    def _spawn(self, name, argv):
        log = open(os.path.join(self.logdir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_child_setup)
        self.procs.append((name, p, log))
        return p

    def worker_argv(self, role, idx):
        wid = "%s-%d" % (role, idx)
        common = ["--router", self.control, "--worker-id", wid, "--model", self.model,
                  "--threads", str(self.threads), "--block-size", "16",
                  "--kv-blocks", str(self.kv_blocks), "--hash-seed", str(self.hash_seed),
                  "--peer-bind", "tcp://127.0.0.1:%d" % free_port()]
        if role == "prefill":
            return [os.path.join(self.build, "prefill_worker", "baton-prefill")] + common + [
                "--kv-events-bind", "tcp://127.0.0.1:%d" % free_port()]
        if role == "decode":
            return [os.path.join(self.build, "decode_worker", "baton-decode")] + common
        return [os.path.join(self.build, "colocated_worker", "baton-worker"), "--role", "both"] + \
            common + ["--kv-events-bind", "tcp://127.0.0.1:%d" % free_port()]

    def start(self, ready_timeout=90):
        router = os.path.join(self.build, "router", "baton-router")
        self._spawn("router", [router, "--model", self.model, "--http-bind",
                               "127.0.0.1:%d" % self.http_port, "--control-bind", self.control,
                               "--policy", self.policy, "--hash-seed", str(self.hash_seed),
                               "--worker-timeout-ms", "30000"]
                    + self.router_args)
        if self.workers == "fake":
            argv = [sys.executable, os.path.join(HERE, "fake_worker.py"), "--router", self.control,
                    "--seed", str(self.hash_seed), "--n-prefill", str(self.n_prefill)]
            if self.colocated:
                argv.append("--colocated")
            self._spawn("fake_worker", argv + self.fake_args)
        elif self.colocated:
            self._spawn("worker-both-0", self.worker_argv("both", 0))
        else:
            for i in range(self.n_prefill):
                self._spawn("prefill-%d" % i, self.worker_argv("prefill", i))
            for i in range(self.n_decode):
                self._spawn("decode-%d" % i, self.worker_argv("decode", i))
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            for name, p, _ in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("%s exited with %s; log:\n%s" % (name, p.returncode,
                                                                        self.log(name)))
            try:
                st, body = http("GET", self.base + "/health", timeout=2)
                if st == 200:
                    self.model_id = json.loads(http("GET", self.base + "/v1/models")[1])[
                        "data"][0]["id"]
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError("cluster not healthy after %ds; router log:\n%s" %
                           (ready_timeout, self.log("router")))

    def log(self, name):
        try:
            with open(os.path.join(self.logdir, name + ".log")) as f:
                return f.read()[-6000:]
        except OSError:
            return ""

    def metrics(self):
        st, body = http("GET", self.base + "/metrics")
        assert st == 200, st
        return parse_metrics(body.decode())

    def stop(self):
        for _, p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        for name, p, log in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
        codes = {name: p.returncode for name, p, _ in self.procs}
        self.procs = []
        return codes

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
