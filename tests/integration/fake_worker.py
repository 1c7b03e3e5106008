#!/usr/bin/env python3
"""A fake prefill + decode worker pair for developing and testing baton-router
without the model: it speaks proto (msgpack over ZeroMQ, proto/messages.h)
exactly like the real workers, with canned-but-valid token streams.

- Registers a prefill worker and a decode worker (DEALER identities
  `<prefix>-prefill` and `<prefix>-decode`, or `<prefix>-both` with --colocated),
  heartbeats every 500 ms with free/used KV blocks.
- PrefillRequest: after --prefill-ms, sends PrefillDone (copy) to the router
  and publishes KVEvents (stored block hashes, chained XXH3-128 as in
  common/block_hash.h, computed with python-xxhash) on its PUB socket.
- DecodeRequest: "generates" by replaying the prompt's token ids cyclically
  (always valid ids), one token per --token-ms, in TokenChunks, then
  RequestFinished{length}. Abort releases the request's blocks at once and
  answers RequestFinished{abort}.

Usage: fake_worker.py --router tcp://127.0.0.1:5600 [--prefix fake] [--seed S]
       [--vocab 49152] [--colocated] [--token-ms 20] [--prefill-ms 10]
"""
import argparse
import os
import signal
import struct
import sys
import time

import msgpack
import xxhash
import zmq

V = 1
FAKE_PREFILL_DEVICE_US = 7000          # reported per request (PrefillDone, RequestFinished)
FAKE_DECODE_DEVICE_US_PER_TOKEN = 1500  # x completion tokens (RequestFinished)
HITS = {}  # request id -> prefix-cache hit (tokens) measured by the fake prefill


def now_us():
    return int(time.time() * 1e6)


def seed_id(seed):
    return xxhash.xxh3_64_intdigest(struct.pack("<Q", seed))


def chain(tokens, block_size, seed):
    prev = bytes(16)
    out = []
    for b in range(len(tokens) // block_size):
        blk = tokens[b * block_size:(b + 1) * block_size]
        h = xxhash.xxh3_128_digest(prev + struct.pack("<%di" % len(blk), *blk), seed=seed)
        out.append((h, prev if b > 0 else bytes(16)))
        prev = h
    return out


class Worker:
    def __init__(self, ctx, args, wid, role):
        self.id = wid
        self.role = role
        self.args = args
        self.epoch = now_us()
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, wid.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(args.router)
        self.pub = None
        self.pub_ep = ""
        self.seq = 0
        self.cached = set()
        if role in ("prefill", "both"):
            self.pub = ctx.socket(zmq.PUB)
            self.pub.setsockopt(zmq.LINGER, 0)
            self.pub.bind("tcp://127.0.0.1:*")
            self.pub_ep = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.total_blocks = args.kv_blocks
        self.hit_blocks = 0
        self.lookup_blocks = 0
        self.used = {}  # request id -> blocks
        self.decoding = {}  # request id -> state
        self.prefills = []  # (due, msg)

    def send(self, msg):
        msg["v"] = V
        self.sock.send(msgpack.packb(msg, use_bin_type=True))

    def register(self):
        self.send({
            "type": "worker_register", "worker_id": self.id, "role": self.role,
            "epoch": self.epoch, "zmq_endpoint": "", "model_sha256": bytes(32),
            "vocab_size": self.args.vocab,
            "kv": {"n_layers": 30, "n_kv_heads": 3, "head_dim": 64,
                   "block_size": self.args.block_size, "dtype": "f32",
                   "hash_seed_id": seed_id(self.args.seed)},
            "ucx_address": b"",
            "pool": {"regions": [], "n_blocks": self.total_blocks, "block_bytes": 0},
            "kv_events_endpoint": self.pub_ep,
            # serving configuration (issue 6, optional fields)
            "max_batch_tokens": 512, "max_batch": 64, "cpu_model": "fake-cpu",
            "backend": "fake", "compute_dtype": "f32",
        })

    def heartbeat(self):
        self.n_heartbeats = getattr(self, "n_heartbeats", 0) + 1
        used = sum(self.used.values())
        self.send({
            "type": "worker_heartbeat", "worker_id": self.id, "role": self.role,
            "epoch": self.epoch, "ts_us": now_us(), "queued_prefill_tokens": 0,
            "n_running": len(self.decoding), "n_waiting": 0,
            "free_blocks": self.total_blocks - used, "total_blocks": self.total_blocks,
            "batch_occupancy": 0.0, "used_blocks": used,
            "cache_hit_blocks": self.hit_blocks, "cache_lookup_blocks": self.lookup_blocks,
            # canned busy time: +250 ms per 500 ms heartbeat -> utilisation about 0.5
            "busy_us": self.n_heartbeats * 250000, "steps": self.n_heartbeats,
            "idle_gaps": 3, "idle_gap_us": 3000, "idle_gap_max_us": 2000,
        })

    def publish(self, tokens):
        hashes = chain(tokens, self.args.block_size, self.args.seed)
        stored = [{"h": h, "p": p, "n": self.args.block_size}
                  for h, p in hashes if h not in self.cached]
        if not stored:
            return
        for s in stored:
            self.cached.add(s["h"])
        self.seq += 1
        ev = {"type": "kv_event", "v": V, "worker_id": self.id, "epoch": self.epoch,
              "seq": self.seq, "full": False, "full_part": 0, "full_last": False,
              "stored": stored, "removed": []}
        self.pub.send_multipart([self.id.encode(), msgpack.packb(ev, use_bin_type=True)])

    def on_message(self, m, router_send):
        t = m.get("type")
        rid = m.get("request_id")
        if t == "prefill_request":
            nblk = (len(m["token_ids"]) + self.args.block_size - 1) // self.args.block_size
            self.used[rid] = self.used.get(rid, 0) + nblk
            self.prefills.append((time.time() + self.args.prefill_ms / 1000.0, m))
        elif t == "decode_request":
            bs = self.args.block_size
            need = (m["n_prompt_tokens"] + m["sampling"]["max_tokens"] + bs - 1) // bs
            if need > self.total_blocks:  # as the real decode worker: refused at once
                self.send({"type": "request_finished", "request_id": rid, "worker_id": self.id,
                           "finish_reason": "error", "status": -7,
                           "error": "cannot fit: %d blocks > pool of %d" % (need,
                                                                            self.total_blocks),
                           "prompt_tokens": m["n_prompt_tokens"], "completion_tokens": 0,
                           "cached_tokens": 0,
                           "timings": {"queue_us": 0, "prefill_us": 0, "transfer_us": 0,
                                       "transfer_bytes": 0, "decode_us": 0}})
                return
            self.used[rid] = self.used.get(rid, 0) + m["n_blocks"]
            self.decoding[rid] = {"m": m, "next": time.time() + self.args.prefill_ms / 1000.0,
                                  "i": 0}
        elif t == "abort":
            self.prefills = [(d, x) for d, x in self.prefills if x["request_id"] != rid]
            self.used.pop(rid, None)
            if rid in self.decoding:
                st = self.decoding.pop(rid)
                self.finished(rid, "abort", len(st["m"]["token_ids"]), st["i"])
        elif t == "kv_resync":
            self.seq += 1
            stored = [{"h": h, "p": bytes(16), "n": self.args.block_size} for h in self.cached]
            ev = {"type": "kv_event", "v": V, "worker_id": self.id, "epoch": self.epoch,
                  "seq": self.seq, "full": True, "full_part": 0, "full_last": True,
                  "stored": stored, "removed": []}
            self.pub.send_multipart([self.id.encode(), msgpack.packb(ev, use_bin_type=True)])

    def finished(self, rid, reason, n_prompt, n_out):
        self.send({"type": "request_finished", "request_id": rid, "worker_id": self.id,
                   "finish_reason": reason, "status": 0, "error": "",
                   "prompt_tokens": n_prompt, "completion_tokens": n_out,
                   "cached_tokens": HITS.pop(rid, 0),
                   "timings": {"queue_us": 10, "prefill_us": self.args.prefill_ms * 1000,
                               "transfer_us": 5, "transfer_bytes": 1024,
                               "decode_us": n_out * self.args.token_ms * 1000},
                   # canned device time (issue 6): the test checks these exact values
                   "prefill_device_us": FAKE_PREFILL_DEVICE_US,
                   "decode_device_us": n_out * FAKE_DECODE_DEVICE_US_PER_TOKEN})

    def step(self):
        t = time.time()
        keep = []
        for due, m in self.prefills:
            if due > t:
                keep.append((due, m))
                continue
            rid = m["request_id"]
            self.used.pop(rid, None)  # blocks go to the (fake) radix cache
            hit = 0
            for h, _ in chain(m["token_ids"], self.args.block_size, self.args.seed):
                if h not in self.cached:
                    break
                hit += self.args.block_size
            HITS[rid] = hit
            self.hit_blocks += hit // self.args.block_size
            self.lookup_blocks += len(m["token_ids"]) // self.args.block_size
            self.publish(m["token_ids"])
            self.send({"type": "prefill_done", "request_id": rid, "prefill_worker_id": self.id,
                       "status": 0, "error": "", "first_token": m["token_ids"][0],
                       "first_logprob": -0.5, "n_blocks_written": 1, "bytes_written": 1024,
                       "queue_us": 10, "compute_us": self.args.prefill_ms * 1000,
                       "transfer_us": 5, "device_us": FAKE_PREFILL_DEVICE_US})
        self.prefills = keep
        entries = []
        for rid, st in list(self.decoding.items()):
            if st["next"] > t:
                continue
            m = st["m"]
            toks = m["token_ids"]
            tok = toks[st["i"] % len(toks)]
            st["i"] += 1
            st["next"] = t + self.args.token_ms / 1000.0
            done = st["i"] >= m["sampling"]["max_tokens"]
            entries.append({"request_id": rid, "token_ids": [tok],
                            "finish_reason": "length" if done else "none"})
            smp = m["sampling"]
            if smp.get("logprobs"):
                entries[-1]["logprobs"] = [-0.5]
                k = smp.get("top_logprobs", 0)
                if k:
                    entries[-1]["top_k"] = k
                    entries[-1]["top_logprobs"] = [{"t": tok, "lp": -0.5}] + [
                        {"t": (tok + j) % self.args.vocab, "lp": -1.0 - j} for j in range(1, k)]
            if done:
                del self.decoding[rid]
                self.used.pop(rid, None)
                st["done"] = True
                entries[-1]["_fin"] = (rid, len(toks), st["i"])
        if entries:
            fins = [e.pop("_fin") for e in entries if "_fin" in e]
            self.send({"type": "token_chunk", "worker_id": self.id, "step_id": 0,
                       "entries": entries})
            for rid, n_prompt, n_out in fins:
                self.finished(rid, "length", n_prompt, n_out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--prefix", default="fake")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-blocks", type=int, default=1024)
    ap.add_argument("--token-ms", type=int, default=20)
    ap.add_argument("--prefill-ms", type=int, default=10)
    ap.add_argument("--colocated", action="store_true")
    ap.add_argument("--n-prefill", type=int, default=1)
    args = ap.parse_args()
    ctx = zmq.Context()
    if args.colocated:
        workers = [Worker(ctx, args, args.prefix + "-both", "both")]
    else:
        workers = [Worker(ctx, args, "%s-prefill%d" % (args.prefix, i), "prefill")
                   for i in range(args.n_prefill)]
        workers.append(Worker(ctx, args, args.prefix + "-decode", "decode"))
    for w in workers:
        w.register()
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    poller = zmq.Poller()
    for w in workers:
        poller.register(w.sock, zmq.POLLIN)
    last_hb = 0.0
    while not stop:
        events = dict(poller.poll(5))
        for w in workers:
            if w.sock in events:
                while True:
                    try:
                        raw = w.sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    w.on_message(msgpack.unpackb(raw, raw=False), None)
            w.step()
        if time.time() - last_hb > 0.5:
            last_hb = time.time()
            for w in workers:
                w.heartbeat()
    for w in workers:
        w.sock.close()
        if w.pub:
            w.pub.close()
    ctx.term()


if __name__ == "__main__":
    main()
