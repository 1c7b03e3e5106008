"""A Python stand-in for baton-router's control plane (cluster.md), for the
worker integration tests and scripts/bench-disagg.

It binds the router's ZeroMQ ROUTER socket, accepts WorkerRegister and
WorkerHeartbeat, sends PrefillRequest / DecodeRequest / Abort / KVResync as
proto/messages.h defines them (msgpack maps with "type" and "v"), collects
TokenChunk, RequestFinished and PrefillDone copies, and subscribes to every
worker's KV-event PUB endpoint to track the blocks each worker caches.

All socket work happens on one background thread (ZeroMQ sockets are not
thread-safe); the public methods queue sends and wait on a condition
variable. Every wait is bounded.
"""

import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time

import msgpack
import zmq

PROTO_VERSION = 1
GEOMETRY_FIELDS = ("n_layers", "n_kv_heads", "head_dim", "block_size", "dtype", "hash_seed_id")


class PairingError(Exception):
    """A prefill/decode pair the router must refuse (differing geometry)."""


def sampling_map(max_tokens, temperature=0.0, seed=0, ignore_eos=True, logprobs=False,
                 top_logprobs=0, stop_token_ids=()):
    return {
        "temperature": float(temperature), "top_p": 1.0, "top_k": 0, "min_p": 0.0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "seed": int(seed), "max_tokens": int(max_tokens),
        "stop_token_ids": list(stop_token_ids), "logprobs": bool(logprobs),
        "top_logprobs": int(top_logprobs), "ignore_eos": bool(ignore_eos),
    }


class Request:
    def __init__(self, rid, prompt, p, d):
        self.rid = rid
        self.prompt = list(prompt)
        self.p, self.d = p, d
        self.tokens = []          # every generated token, first included, in order
        self.chunks = 0           # TokenChunk entries received
        self.finish_in_chunk = None
        self.finished = None      # RequestFinished map
        self.prefill_done = None  # PrefillDone copy from the prefill worker
        self.t_prefill_done = None
        self.t_submit = time.monotonic()
        self.t_first = None       # first TokenChunk entry with tokens
        self.t_done = None
        self.token_times = []

    @property
    def done(self):
        return self.finished is not None


class FakeRouter:
    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = "tcp://127.0.0.1:%d" % port
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.cond = threading.Condition()
        self.outbox = queue.Queue()
        self.workers = {}      # id -> {"register": map, "hb": map, "n_hb": int, "hb_time": t}
        self.requests = {}     # rid bytes -> Request
        self.cached = {}       # worker id -> set of block hashes (from KV events)
        self.kv_seq = {}       # worker id -> (epoch, last seq)
        self.kv_gaps = 0
        self.unknown = []      # messages for unknown requests / types
        self.bad = []          # frames that did not decode
        self.stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    # ---- background thread ---------------------------------------------------
    def _loop(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.sub, zmq.POLLIN)
        while not self.stop:
            while True:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
                kind, arg, result = item
                try:
                    if kind == "send":
                        peer, payload = arg
                        self.sock.send_multipart([peer.encode(), payload])
                    elif kind == "connect_sub":
                        self.sub.connect(arg)
                    result.put(None)
                except zmq.ZMQError as e:
                    result.put(e)
            events = dict(poller.poll(5))
            if self.sock in events:
                while True:
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 2:
                        self._on_msg(frames[0].decode(), frames[1])
                    else:
                        self.bad.append(frames)
            if self.sub in events:
                while True:
                    try:
                        frames = self.sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) == 2:
                        self._on_kv_event(frames[0].decode(), frames[1])
                    else:
                        self.bad.append(frames)
        self.sock.close(0)
        self.sub.close(0)

    def _decode(self, payload):
        try:
            m = msgpack.unpackb(payload, raw=False)
        except Exception as e:  # noqa: BLE001 (any malformed frame is recorded)
            self.bad.append(repr(e))
            return None
        if not isinstance(m, dict) or m.get("v") != PROTO_VERSION:
            self.bad.append(m)
            return None
        return m

    def _on_msg(self, peer, payload):
        m = self._decode(payload)
        if m is None:
            return
        t = m.get("type")
        now = time.monotonic()
        with self.cond:
            if t == "worker_register":
                w = self.workers.setdefault(peer, {"hb": None, "n_hb": 0, "hbs": []})
                w["register"] = m
                ep = m.get("kv_events_endpoint")
                if ep:
                    self.cached.setdefault(peer, set())
                    self.outbox.put(("connect_sub", ep, queue.Queue()))
            elif t == "worker_heartbeat":
                w = self.workers.setdefault(peer, {"hb": None, "n_hb": 0, "hbs": []})
                w["hb"] = m
                w["n_hb"] += 1
                w["hb_time"] = now
            elif t == "token_chunk":
                for e in m["entries"]:
                    r = self.requests.get(bytes(e["request_id"]))
                    if r is None:
                        self.unknown.append(m)
                        continue
                    if e["token_ids"] and r.t_first is None:
                        r.t_first = now
                    r.tokens.extend(e["token_ids"])
                    r.token_times.extend([now] * len(e["token_ids"]))
                    r.chunks += 1
                    if e.get("finish_reason", "none") != "none":
                        r.finish_in_chunk = e["finish_reason"]
            elif t == "request_finished":
                r = self.requests.get(bytes(m["request_id"]))
                if r is None:
                    self.unknown.append(m)
                else:
                    r.finished = m
                    r.t_done = now
            elif t == "prefill_done":
                r = self.requests.get(bytes(m["request_id"]))
                if r is None:
                    self.unknown.append(m)
                else:
                    r.prefill_done = m
                    r.t_prefill_done = now
            else:
                self.unknown.append(m)
            self.cond.notify_all()

    def _on_kv_event(self, topic, payload):
        m = self._decode(payload)
        if m is None or m.get("type") != "kv_event":
            return
        wid = m["worker_id"]
        with self.cond:
            s = self.cached.setdefault(wid, set())
            epoch, seq = m["epoch"], m["seq"]
            last = self.kv_seq.get(wid)
            if m.get("full"):
                if m.get("full_part", 0) == 0:
                    s.clear()
            elif last is not None and last[0] == epoch and seq != last[1] + 1:
                self.kv_gaps += 1
            for st in m["stored"]:
                s.add(bytes(st["h"]))
            for h in m["removed"]:
                s.discard(bytes(h))
            self.kv_seq[wid] = (epoch, seq)
            self.cond.notify_all()

    # ---- helpers ----------------------------------------------------------------
    def _send(self, peer, m, timeout=5.0):
        m = dict(m)
        m["v"] = PROTO_VERSION
        res = queue.Queue()
        self.outbox.put(("send", (peer, msgpack.packb(m, use_bin_type=True)), res))
        err = res.get(timeout=timeout)
        if err is not None:
            raise err

    def wait_for(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out after %.1f s waiting for %s" % (timeout, what))
                self.cond.wait(min(left, 0.1))

    def wait_registered(self, wids, timeout=60.0):
        self.wait_for(lambda: all(w in self.workers and "register" in self.workers[w]
                                  and self.workers[w]["n_hb"] > 0 for w in wids),
                      timeout, "registration of %s" % (wids,))

    def register(self, wid):
        with self.cond:
            return self.workers[wid]["register"]

    def heartbeat(self, wid):
        with self.cond:
            return dict(self.workers[wid]["hb"])

    def next_heartbeat(self, wid, timeout=5.0):
        """The first heartbeat sent after this call."""
        with self.cond:
            n0 = self.workers[wid]["n_hb"]
        self.wait_for(lambda: self.workers[wid]["n_hb"] > n0, timeout, "a heartbeat of " + wid)
        return self.heartbeat(wid)

    def n_cached(self, wid):
        with self.cond:
            return len(self.cached.get(wid, ()))

    def block_size(self, wid):
        return self.register(wid)["kv"]["block_size"]

    def pair_check(self, p, d):
        """The router's pairing rule (cluster.md "Geometry and pairing"):
        raises PairingError naming the first differing field."""
        rp, rd = self.register(p), self.register(d)
        if rp["role"] not in ("prefill", "both"):
            raise PairingError("%s is not a prefill worker (role %s)" % (p, rp["role"]))
        if rd["role"] not in ("decode", "both"):
            raise PairingError("%s is not a decode worker (role %s)" % (d, rd["role"]))
        for f in GEOMETRY_FIELDS:
            if rp["kv"][f] != rd["kv"][f]:
                raise PairingError("%s and %s differ in kv.%s (%r vs %r)"
                                   % (p, d, f, rp["kv"][f], rd["kv"][f]))
        if bytes(rp["model_sha256"]) != bytes(rd["model_sha256"]):
            raise PairingError("%s and %s differ in model_sha256" % (p, d))
        if rp["vocab_size"] != rd["vocab_size"]:
            raise PairingError("%s and %s differ in vocab_size" % (p, d))

    # ---- requests --------------------------------------------------------------------
    def submit(self, p, d, prompt, max_tokens, cache_salt=0, **sampling):
        """Routes one request: DecodeRequest to d, then PrefillRequest to p
        (the same worker for a colocated one). Returns the request id."""
        self.pair_check(p, d)
        rid = secrets.token_bytes(16)
        B = self.block_size(d)
        smp = sampling_map(max_tokens, **sampling)
        req = Request(rid, prompt, p, d)
        with self.cond:
            self.requests[rid] = req
        rp, rd = self.register(p), self.register(d)
        self._send(d, {
            "type": "decode_request", "request_id": rid, "prefill_worker_id": p,
            "n_prompt_tokens": len(prompt), "n_blocks": (len(prompt) + B - 1) // B,
            "token_ids": list(prompt), "sampling": smp, "tenant": "test",
            "cache_salt": cache_salt, "deadline_unix_us": 0,
            "prefill_endpoint": rp["zmq_endpoint"],
        })
        self._send(p, {
            "type": "prefill_request", "request_id": rid, "decode_worker_id": d,
            "decode_epoch": rd["epoch"], "token_ids": list(prompt), "sampling": smp,
            "tenant": "test", "cache_salt": cache_salt, "deadline_unix_us": 0,
            "decode_endpoint": rd["zmq_endpoint"],
        })
        return rid

    def abort(self, rid, workers, reason="client gone"):
        for w in workers:
            self._send(w, {"type": "abort", "request_id": rid, "reason": reason})

    def kv_resync(self, wid):
        with self.cond:
            epoch, seq = self.kv_seq.get(wid, (self.register(wid)["epoch"], 0))
        self._send(wid, {"type": "kv_resync", "worker_id": wid, "epoch": epoch, "last_seq": seq})

    def request(self, rid):
        with self.cond:
            return self.requests[rid]

    def wait_done(self, rids, timeout):
        self.wait_for(lambda: all(self.requests[r].done for r in rids), timeout,
                      "%d request(s) to finish" % len(rids))
        return [self.requests[r] for r in rids]

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.ctx.term()


# ---- processes ---------------------------------------------------------------------

def binary_dir():
    return os.environ.get("BATON_BINARY_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")


def model_path():
    p = os.environ.get("BATON_MODEL") or os.path.expanduser(
        "~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(p):
        raise FileNotFoundError("default model missing: %s (run scripts/fetch-model)" % p)
    return p


WORKER_BINARIES = {
    "prefill": ("prefill_worker", "baton-prefill"),
    "decode": ("decode_worker", "baton-decode"),
    "both": ("colocated_worker", "baton-worker"),
}


def worker_binary(role):
    sub, name = WORKER_BINARIES[role]
    return os.path.join(binary_dir(), sub, name)


def _die_with_parent():
    """In the child before exec: SIGTERM when the test driver dies (even
    by SIGKILL, e.g. a ctest timeout), so no worker outlives its test."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def exit_on_sigterm():
    """Turns SIGTERM into SystemExit so the caller's finally stops its
    processes."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class Procs:
    """Started processes, each logging to its own file; stop_all() kills
    whatever is still running (call it in a finally)."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.procs = {}

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.log_dir, name + ".log"), "wb")
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        if env:
            e.update(env)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=e,
                             preexec_fn=_die_with_parent)
        self.procs[name] = (p, log)
        return p

    def start_worker(self, name, role, router, threads=1, kv_blocks=256, block_size=16,
                     extra=()):
        argv = [worker_binary(role)]
        if role == "both":
            argv += ["--role", "both"]
        argv += ["--router", router, "--worker-id", name, "--model", model_path(),
                 "--threads", str(threads), "--kv-blocks", str(kv_blocks),
                 "--block-size", str(block_size), "--peer-bind", "tcp://127.0.0.1:0"]
        if role != "decode":
            argv += ["--kv-events-bind", "tcp://127.0.0.1:0"]
        argv += list(extra)
        return self.start(name, argv)

    def log(self, name):
        p = os.path.join(self.log_dir, name + ".log")
        try:
            with open(p, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def alive(self, name):
        return self.procs[name][0].poll() is None

    def kill(self, name, sig=signal.SIGKILL):
        p, _ = self.procs[name]
        if p.poll() is None:
            p.send_signal(sig)
        p.wait(timeout=30)

    def stop(self, name, timeout=20):
        """SIGTERM, wait (a clean exit lets LeakSanitizer check), then
        SIGKILL. Returns the exit status."""
        p, log = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        log.close()
        return p.returncode

    def stop_all(self):
        codes = {}
        for name in list(self.procs):
            try:
                codes[name] = self.stop(name)
            except Exception as e:  # noqa: BLE001 (cleanup must go on)
                codes[name] = repr(e)
        return codes


def reference_generate(prompts, max_tokens, parallel=2, timeout=400):
    """Greedy tokens of `baton generate --print-ids --ignore-eos` (the
    single-sequence engine) for each prompt text: a list of
    (prompt_ids, generated_ids)."""
    baton = os.path.join(binary_dir(), "cli", "baton")
    out = [None] * len(prompts)
    running = []
    i = 0
    deadline = time.monotonic() + timeout

    def collect(k, p):
        _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        if p.returncode != 0:
            raise RuntimeError("baton generate failed for prompt %d: %s" % (k, err.decode()))
        pids = gids = None
        for line in err.decode().splitlines():
            if line.startswith("prompt ids:"):
                pids = [int(x) for x in line.split(":", 1)[1].split()]
            elif line.startswith("generated ids:"):
                gids = [int(x) for x in line.split(":", 1)[1].split()]
        if pids is None or gids is None:
            raise RuntimeError("baton generate printed no ids: " + err.decode())
        out[k] = (pids, gids)

    while i < len(prompts) or running:
        while i < len(prompts) and len(running) < parallel:
            p = subprocess.Popen([baton, "generate", "--model", model_path(), "--prompt", prompts[i],
                                  "--max-tokens", str(max_tokens), "--ignore-eos", "--print-ids",
                                  "--threads", "1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            running.append((i, p))
            i += 1
        k, p = running.pop(0)
        collect(k, p)
    return out
