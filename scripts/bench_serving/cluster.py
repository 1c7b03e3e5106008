"""Starts and stops a local baton cluster for ``baton bench --compare``.

Two launchers:

* ``binaries`` (default): baton-router plus baton-prefill / baton-decode, or
  ``baton-worker --role both`` for --colocated, from a build folder, with the
  options of the cluster wiring contract, every socket on 127.0.0.1 with a
  free port, logs in a folder.
* ``baton-up``: runs scripts/baton-up (``--port``, ``--prefill N --decode N``
  or ``--colocated``, ``--policy``, ``--threads``, ``--model``,
  ``--kv-blocks``, ``--build``, ``--log-dir``, ``-- router options``).

Everything started is stopped by stop() (SIGTERM to each process group, then
SIGKILL after a grace period)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import List, Optional


class ClusterError(RuntimeError):
    """The cluster could not be started (message names the cause)."""


@dataclass
class ClusterConfig:
    name: str
    policy: str = "cache_aware"
    prefill: int = 1
    decode: int = 1
    colocated: bool = False
    threads: int = 0  # threads per worker; 0 = the command line's --threads

    @staticmethod
    def parse(spec: str) -> "ClusterConfig":
        """'NAME' preset (cache_aware, round_robin, least_loaded, colocated,
        disagg) or 'NAME:key=val,...' with keys policy, prefill, decode,
        colocated (0/1), threads (per worker, e.g. to give a colocated worker
        the cores a prefill/decode pair gets).  With colocated, prefill is the number of
        baton-worker --role both processes."""
        name, _, rest = spec.partition(":")
        c = ClusterConfig(name=name)
        if name in ("cache_aware", "round_robin", "least_loaded"):
            c.policy = name
        elif name == "colocated":
            c.colocated = True
        if rest:
            for kv in rest.split(","):
                k, sep, v = kv.partition("=")
                if not sep:
                    raise ValueError(f"config '{spec}': '{kv}' is not key=value")
                if k == "policy":
                    c.policy = v
                elif k in ("prefill", "decode", "threads"):
                    if not v.isdigit() or int(v) < 1:
                        raise ValueError(f"config '{spec}': {k} must be an integer >= 1")
                    setattr(c, k, int(v))
                elif k == "colocated":
                    c.colocated = v in ("1", "true", "yes")
                else:
                    raise ValueError(f"config '{spec}': unknown key '{k}'")
        return c

    def as_dict(self) -> dict:
        d = {"name": self.name, "policy": self.policy, "prefill": self.prefill,
             "decode": self.decode, "colocated": self.colocated}
        if self.threads:
            d["threads"] = self.threads
        return d


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Cluster:
    def __init__(self, cfg: ClusterConfig, model: str, build_dir: Optional[str] = None,
                 launcher: str = "binaries", threads: int = 2, kv_blocks: int = 4096,
                 hash_seed: int = 20261129, source_dir: Optional[str] = None,
                 logdir: Optional[str] = None, router_args: Optional[List[str]] = None):
        self.cfg = cfg
        self.model = model
        self.build_dir = build_dir
        self.launcher = launcher
        self.threads = cfg.threads or threads
        self.kv_blocks = kv_blocks
        self.hash_seed = hash_seed
        self.source_dir = source_dir or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
        self.logdir = logdir or tempfile.mkdtemp(prefix=f"baton-bench-{cfg.name}-")
        self.router_args = list(router_args or [])
        self.procs: List[tuple] = []
        self.base = ""

    def binary(self, sub: str, name: str) -> str:
        if not self.build_dir:
            raise ClusterError("no build folder: pass --build-dir or set BATON_BINARY_DIR")
        p = os.path.join(self.build_dir, sub, name)
        if not os.access(p, os.X_OK):
            raise ClusterError(f"{name} binary missing: {p} (build it first)")
        return p

    def _spawn(self, name: str, argv: List[str]) -> None:
        log = open(os.path.join(self.logdir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p, log))

    def _worker(self, role: str, idx: int, control: str) -> List[str]:
        common = ["--router", control, "--worker-id", f"{role}-{idx}", "--model", self.model,
                  "--threads", str(self.threads), "--block-size", "16",
                  "--kv-blocks", str(self.kv_blocks), "--hash-seed", str(self.hash_seed),
                  "--peer-bind", f"tcp://127.0.0.1:{free_port()}"]
        events = ["--kv-events-bind", f"tcp://127.0.0.1:{free_port()}"]
        if role == "prefill":
            return [self.binary("prefill_worker", "baton-prefill")] + common + events
        if role == "decode":
            return [self.binary("decode_worker", "baton-decode")] + common
        return [self.binary("colocated_worker", "baton-worker"), "--role", "both"] + common + events

    def start(self, ready_timeout_s: float = 120.0) -> "Cluster":
        if self.launcher == "baton-up":
            up = os.path.join(self.source_dir, "scripts", "baton-up")
            if not os.access(up, os.X_OK):
                raise ClusterError(f"scripts/baton-up missing: {up}")
            port = free_port()
            argv = [up, "--port", str(port), "--policy", self.cfg.policy,
                    "--threads", str(self.threads), "--model", self.model,
                    "--kv-blocks", str(self.kv_blocks),
                    "--log-dir", os.path.join(self.logdir, "baton-up-logs")]
            if self.build_dir:
                argv += ["--build", self.build_dir]
            argv += ["--colocated"] if self.cfg.colocated else \
                ["--prefill", str(self.cfg.prefill), "--decode", str(self.cfg.decode)]
            if self.router_args:
                argv += ["--"] + self.router_args
            self._spawn("baton-up", argv)
            self.base = f"http://127.0.0.1:{port}"
        else:
            router = self.binary("router", "baton-router")
            argvs = []
            if self.cfg.colocated:
                # colocated: `prefill` counts the baton-worker --role both processes
                argvs += [(f"worker-both-{i}", ("both", i)) for i in range(self.cfg.prefill)]
            else:
                argvs += [(f"prefill-{i}", ("prefill", i)) for i in range(self.cfg.prefill)]
                argvs += [(f"decode-{i}", ("decode", i)) for i in range(self.cfg.decode)]
            port = free_port()
            control = f"tcp://127.0.0.1:{free_port()}"
            # resolve every binary before starting anything
            worker_argv = [(n, self._worker(*r, control)) for n, r in argvs]
            self._spawn("router", [router, "--model", self.model, "--http-bind", f"127.0.0.1:{port}",
                                   "--control-bind", control, "--policy", self.cfg.policy,
                                   "--hash-seed", str(self.hash_seed)] + self.router_args)
            for n, argv in worker_argv:
                self._spawn(n, argv)
            self.base = f"http://127.0.0.1:{port}"
        deadline = time.time() + ready_timeout_s
        while time.time() < deadline:
            for name, p, _ in self.procs:
                if p.poll() is not None:
                    tail = self.log(name)
                    self.stop()
                    raise ClusterError(f"{name} exited with {p.returncode}; log tail:\n{tail}")
            if self.base and _healthy(self.base):
                return self
            time.sleep(0.25)
        self.stop()
        raise ClusterError(f"cluster '{self.cfg.name}' not healthy after {ready_timeout_s:.0f} s "
                           f"(logs in {self.logdir})")

    def log(self, name: str) -> str:
        try:
            with open(os.path.join(self.logdir, name + ".log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self) -> dict:
        for _, p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 15
        for _, p, _ in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        codes = {}
        for name, p, log in self.procs:
            log.close()
            codes[name] = p.returncode
        self.procs = []
        return codes

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
