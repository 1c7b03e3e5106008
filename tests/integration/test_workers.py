"""Worker integration tests (issue 4 "Show it works"): real baton-worker /
baton-prefill / baton-decode processes on loopback with the default model,
driven by fake_router.py (the router's control plane in Python).

    test_workers.py SCENARIO

Scenarios (each is one ctest test, see tests/workers.cmake):
  colocated_generate  16 concurrent prompts on `baton-worker --role both`
                      give exactly the greedy tokens of `baton generate`
  colocated_prefix    prefix cache cold/warm on the colocated worker
  colocated_abort     abort during prefill and during decode: used blocks
                      return to the idle value
  disagg_generate     16 concurrent prompts through 1 prefill + 1 decode
                      worker == `baton generate` == the colocated worker
  disagg_prefix       prefix cache cold/warm through prefill + decode
  disagg_pairing      block size 16 vs 32 and a different model: refused at
                      pairing with an error naming the field
  disagg_abort        abort during prefill, transfer and decode: both
                      workers' used blocks return to their idle value
  disagg_kill_decode  decode worker killed mid-transfer: the prefill worker
                      reports within 5 s, frees its blocks, keeps serving

"Idle value" of used blocks: a decode worker holds no block when idle; a
prefill (or colocated) worker holds exactly the blocks its radix cache
keeps, which the test counts independently from the worker's KV events.

Binaries come from $BATON_BINARY_DIR; every process is stopped in a
finally (SIGTERM, so LeakSanitizer runs, then SIGKILL) and every wait is
bounded.
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_router as fr  # noqa: E402

MAX_TOKENS = 8

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The speed of light is approximately",
    "My favourite book is",
    "In 1969, the first humans",
    "The square root of 144 is",
    "A haiku about autumn:",
    "The chemical symbol for gold is",
    "Photosynthesis is the process by which",
    "The best way to learn a language is",
    "Here is a list of fruits: apple, banana,",
]

SYSTEM_TEXT = ("You are a helpful assistant for a small public library. Answer briefly and "
               "precisely, cite no sources, never invent facts that you do not know for certain, "
               "and say so plainly when a question is outside what you know.")
TAIL_TEXTS = [
    "Question: what is the tallest mountain on Earth, where is it located exactly, and who "
    "were the first climbers to reach its summit and come back down safely?",
    "Question: how many legs does a spider have, how many does an insect have, and why are "
    "spiders not counted among the insects by the people who classify animals?",
    "Question: which ocean is the largest by area, which one is the smallest, and how deep "
    "is the deepest known point of the largest one in metres below the surface?",
]

FAILURES = []


def check(cond, what):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        FAILURES.append(what)


def log_dir(name):
    base = os.environ.get("BATON_BINARY_DIR") or tempfile.gettempdir()
    return os.path.join(base, "test-logs", "workers-" + name)


def wait_idle(router, wid, expect_used, timeout=15.0):
    """Waits until a heartbeat reports no request in flight and used_blocks
    == expect_used() (evaluated after each heartbeat). Returns the last
    heartbeat."""
    deadline = time.monotonic() + timeout
    hb = None
    while time.monotonic() < deadline:
        # 10 s: the router drops a worker silent for longer (--worker-timeout-ms)
        hb = router.next_heartbeat(wid, timeout=10.0)
        busy = hb["n_running"] or hb["n_waiting"] or hb["queued_prefill_tokens"]
        if not busy and hb.get("used_blocks", 0) == expect_used():
            return hb
    return hb


def start_colocated(procs, router, name="colo", threads=1, extra=()):
    procs.start_worker(name, "both", router.endpoint, threads=threads, kv_blocks=256,
                       extra=list(extra))
    return name


def start_disagg(procs, router, p="pf", d="dc", extra_p=(), extra_d=(), d_block=16, d_model=None):
    procs.start_worker(p, "prefill", router.endpoint, extra=list(extra_p))
    extra = list(extra_d)
    if d_model:
        extra = ["--model", d_model] + extra  # later --model wins in the workers' parsers
    procs.start_worker(d, "decode", router.endpoint, block_size=d_block, extra=extra)
    return p, d


def fail_with_logs(procs, names):
    for n in names:
        print("---- log of %s (tail) ----" % n)
        print(procs.log(n)[-4000:])


# ---- scenarios -------------------------------------------------------------------------

def run_generate(router, p, d, refs):
    rids = [router.submit(p, d, pids, MAX_TOKENS) for pids, _ in refs]
    done = router.wait_done(rids, timeout=180)
    outs = []
    for i, (r, (_, gids)) in enumerate(zip(done, refs)):
        check(r.finished["status"] == 0 and r.finished["finish_reason"] == "length",
              "prompt %d finished with length (got %s %s)"
              % (i, r.finished["finish_reason"], r.finished.get("error")))
        check(r.tokens == gids, "prompt %d: tokens %s == baton generate %s" % (i, r.tokens, gids))
        check(r.finished["completion_tokens"] == MAX_TOKENS and
              r.finished["prompt_tokens"] == len(r.prompt), "prompt %d usage" % i)
        outs.append(r.tokens)
    return outs


def scenario_colocated_generate():
    refs = fr.reference_generate(PROMPTS, MAX_TOKENS)
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("colocated_generate"))
    try:
        colo = start_colocated(procs, router, threads=2)
        router.wait_registered([colo], timeout=90)
        reg = router.register(colo)
        check(reg["role"] == "both", "colocated worker registers role both")
        run_generate(router, colo, colo, refs)
        hb = router.next_heartbeat(colo)
        check(hb["steps"] > 0 and hb["busy_us"] > 0, "heartbeat reports steps and busy time")
    finally:
        codes = procs.stop_all()
        router.close()
    check(codes == {"colo": 0}, "worker exits cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, ["colo"])


def prefix_prompts():
    """Prompts of k*B-1, k*B and k*B+1 tokens (B = 16, k = 4) sharing a
    system prompt; ids from baton generate (the tokenizer's reference
    output), so they are real text."""
    refs = fr.reference_generate([SYSTEM_TEXT] + [SYSTEM_TEXT + " " + t for t in TAIL_TEXTS], 1)
    sys_ids = refs[0][0]
    prompts = []
    B, k = 16, 4
    for j, L in enumerate((k * B - 1, k * B, k * B + 1)):
        ids = refs[1 + j][0]
        assert ids[:len(sys_ids) - 1] == sys_ids[:-1], "system prompt is not a token prefix"
        assert len(ids) >= L, "tail too short for %d tokens" % L
        prompts.append(ids[:L])
    shared = 0
    while all(len(p) > shared for p in prompts) and len({p[shared] for p in prompts}) == 1:
        shared += 1
    return prompts, shared


def run_prefix(router, p, d, cache_wid):
    B = router.block_size(p)
    prompts, shared = prefix_prompts()
    shared_blocks = shared // B
    check(shared_blocks >= 2, "prompts share %d tokens = %d full blocks" % (shared, shared_blocks))
    order = [0, 2, 1]  # alternating lengths: kB-1, kB+1, kB

    def one_round(salts):
        before = router.next_heartbeat(cache_wid)
        outs = {}
        for i in order:  # one at a time, so each sees the cache the previous left
            rid = router.submit(p, d, prompts[i], MAX_TOKENS, cache_salt=salts[i])
            [r] = router.wait_done([rid], timeout=120)
            check(r.finished["status"] == 0, "prefix prompt of %d tokens finished (%s)"
                  % (len(prompts[i]), r.finished.get("error")))
            outs[i] = (r.tokens, r.finished["cached_tokens"])
        after = router.next_heartbeat(cache_wid)
        hits = after.get("cache_hit_blocks", 0) - before.get("cache_hit_blocks", 0)
        looks = after.get("cache_lookup_blocks", 0) - before.get("cache_lookup_blocks", 0)
        return outs, hits, looks

    cold, hits_cold, _ = one_round([1001, 1002, 1003])  # distinct salts: nothing shared
    check(hits_cold == 0, "cold round (distinct cache salts): 0 hit blocks (got %d)" % hits_cold)
    first, hits_first, _ = one_round([0, 0, 0])
    # the first prompt of the round finds nothing; the two others reuse the
    # shared full blocks
    check(hits_first == 2 * shared_blocks, "first shared round: %d hit blocks == 2 x %d shared"
          % (hits_first, shared_blocks))
    warm, hits_warm, looks_warm = one_round([0, 0, 0])
    expect = sum((len(q) - 1) // B for q in prompts)
    check(hits_warm == expect, "warm round: %d hit blocks == %d (every full block but the one "
          "holding the last token)" % (hits_warm, expect))
    check(looks_warm >= hits_warm > 0, "warm hit rate %d/%d" % (hits_warm, looks_warm))
    for i in range(3):
        L = len(prompts[i])
        check(cold[i][0] == first[i][0] == warm[i][0],
              "%d-token prompt: cold == shared == warm tokens (%s)" % (L, cold[i][0]))
        check(warm[i][1] == ((L - 1) // B) * B, "%d-token prompt: warm cached_tokens %d == %d"
              % (L, warm[i][1], ((L - 1) // B) * B))
    return {len(prompts[i]): cold[i][0] for i in range(3)}


def scenario_colocated_prefix():
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("colocated_prefix"))
    try:
        colo = start_colocated(procs, router, threads=2)
        router.wait_registered([colo], timeout=90)
        run_prefix(router, colo, colo, colo)
        hb = wait_idle(router, colo, lambda: router.n_cached(colo))
        check(hb.get("used_blocks", 0) == router.n_cached(colo) > 0,
              "idle used blocks %d == blocks cached per KV events %d"
              % (hb.get("used_blocks", 0), router.n_cached(colo)))
        n = router.n_cached(colo)
        router.kv_resync(colo)
        router.wait_for(lambda: router.kv_seq.get(colo) is not None, 5, "resync")
        time.sleep(1.0)
        check(router.n_cached(colo) == n, "KVResync full set has the same %d blocks" % n)
    finally:
        codes = procs.stop_all()
        router.close()
    check(codes == {"colo": 0}, "worker exits cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, ["colo"])


def long_prompt(n):
    refs = fr.reference_generate([" ".join(PROMPTS * 4)], 1)
    ids = refs[0][0]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def abort_and_check(router, rid, workers, idle_checks, what):
    router.abort(rid, workers)
    [r] = router.wait_done([rid], timeout=15)
    check(r.finished["finish_reason"] in ("abort", "error"),
          "%s: RequestFinished %s" % (what, r.finished["finish_reason"]))
    for wid, expect in idle_checks:
        hb = wait_idle(router, wid, expect)
        check(hb.get("used_blocks", 0) == expect(),
              "%s: %s used blocks back to idle %d (got %d)"
              % (what, wid, expect(), hb.get("used_blocks", 0)))


def scenario_colocated_abort():
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("colocated_abort"))
    try:
        colo = start_colocated(procs, router, extra=["--max-batch-tokens", "32"])
        router.wait_registered([colo], timeout=90)
        prompt = long_prompt(800)
        cached = lambda: router.n_cached(colo)  # noqa: E731
        check(wait_idle(router, colo, cached).get("used_blocks", 0) == 0, "starts with 0 used")
        # during prefill: 400 tokens in chunks of 32 take many steps
        rid = router.submit(colo, colo, prompt, 4)
        time.sleep(1.0)  # inside the prefill: the tokens at 32 per step take many steps
        abort_and_check(router, rid, [colo], [(colo, cached)], "abort during prefill")
        check(router.n_cached(colo) == 0, "prefill aborted before its last chunk caches nothing")
        # during decode
        rid = router.submit(colo, colo, prompt[:40], 400)
        router.wait_for(lambda: len(router.request(rid).tokens) >= 2, 180, "decode to start")
        abort_and_check(router, rid, [colo], [(colo, cached)], "abort during decode")
        # still serving
        rid = router.submit(colo, colo, prompt[:20], 4)
        [r] = router.wait_done([rid], timeout=180)
        check(r.finished["status"] == 0 and len(r.tokens) == 4, "serves after aborts")
    finally:
        codes = procs.stop_all()
        router.close()
    check(codes == {"colo": 0}, "worker exits cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, ["colo"])


def scenario_disagg_generate():
    refs = fr.reference_generate(PROMPTS, MAX_TOKENS)
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("disagg_generate"))
    names = ["pf", "dc", "colo"]
    try:
        p, d = start_disagg(procs, router)
        colo = start_colocated(procs, router)
        router.wait_registered([p, d, colo], timeout=120)
        dis = run_generate(router, p, d, refs)
        col = run_generate(router, colo, colo, refs)
        check(dis == col, "disaggregated tokens == colocated tokens for all 16 prompts")
        done = [router.requests[r] for r in router.requests if router.requests[r].p == p]
        n_pd = sum(1 for r in done if r.prefill_done is not None)
        check(n_pd == len(PROMPTS), "router got a PrefillDone copy for each request (%d)" % n_pd)
        check(all(r.prefill_done["bytes_written"] > 0 for r in done if r.prefill_done),
              "PrefillDone reports KV bytes written")
    finally:
        codes = procs.stop_all()
        router.close()
    check(all(c == 0 for c in codes.values()), "workers exit cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, names)


def scenario_disagg_prefix():
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("disagg_prefix"))
    try:
        p, d = start_disagg(procs, router)
        colo = start_colocated(procs, router)
        router.wait_registered([p, d, colo], timeout=120)
        dis = run_prefix(router, p, d, p)
        col = run_prefix(router, colo, colo, colo)
        check(dis == col, "prefix prompts: disaggregated == colocated")
        hb = wait_idle(router, d, lambda: 0)
        check(hb.get("used_blocks", 0) == 0, "decode worker idle: 0 used blocks")
        hb = wait_idle(router, p, lambda: router.n_cached(p))
        check(hb.get("used_blocks", 0) == router.n_cached(p),
              "prefill worker idle: used == cached (%d)" % router.n_cached(p))
    finally:
        codes = procs.stop_all()
        router.close()
    check(all(c == 0 for c in codes.values()), "workers exit cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, ["pf", "dc", "colo"])


def scenario_disagg_pairing():
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("disagg_pairing"))
    tiny = os.path.join(os.environ.get("BATON_SOURCE_DIR", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..")), "tests", "data", "tiny_llama.gguf")
    try:
        procs.start_worker("pf", "prefill", router.endpoint)
        procs.start_worker("dc32", "decode", router.endpoint, block_size=32)
        procs.start_worker("dctiny", "decode", router.endpoint, extra=["--model", tiny])
        router.wait_registered(["pf", "dc32", "dctiny"], timeout=120)
        for d, field in (("dc32", "kv.block_size"), ("dctiny", "kv.")):
            t0 = time.monotonic()
            try:
                router.submit("pf", d, [1, 2, 3], 2)
                check(False, "pair pf/%s refused" % d)
            except fr.PairingError as e:
                check(field in str(e) and time.monotonic() - t0 < 1.0,
                      "pair pf/%s refused at once: %s" % (d, e))
    finally:
        codes = procs.stop_all()
        router.close()
    check(all(c == 0 for c in codes.values()), "workers exit cleanly on SIGTERM (%s)" % codes)


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def http(method, url, body=None, timeout=10.0):
    import json
    import urllib.error
    import urllib.request
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")}


def scenario_disagg_pairing_router():
    """The same refusals by the real baton-router: /health says why it is
    not ready (naming the field) and a completion fails fast, never hangs."""
    router_bin = os.path.join(fr.binary_dir(), "router", "baton-router")
    tiny = os.path.join(os.environ.get("BATON_SOURCE_DIR", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..")), "tests", "data", "tiny_llama.gguf")
    procs = fr.Procs(log_dir("disagg_pairing_router"))
    try:
        for d, extra, words in (("dc32", ["--block-size", "32"], ("block_size", "block size")),
                                ("dctiny", ["--model", tiny], ("differ", "model", "n_layers", "vocab"))):
            hport, cport = free_port(), free_port()
            rname = "router-" + d
            procs.start(rname, [router_bin, "--model", fr.model_path(), "--http-bind",
                                "127.0.0.1:%d" % hport, "--control-bind",
                                "tcp://127.0.0.1:%d" % cport])
            ctl = "tcp://127.0.0.1:%d" % cport
            procs.start_worker("pf-" + d, "prefill", ctl)
            procs.start_worker(d, "decode", ctl, extra=extra)
            base = "http://127.0.0.1:%d" % hport
            deadline = time.monotonic() + 120
            last, ever_ready = None, False
            while time.monotonic() < deadline:
                try:
                    code, body = http("GET", base + "/health", timeout=2)
                except OSError:
                    time.sleep(0.5)
                    continue
                last = (code, body.get("reason", ""))
                ever_ready |= code == 200
                if code == 503 and (any(w in last[1] for w in words) or
                                    any("refused" in ln and d in ln
                                        for ln in procs.log(rname).splitlines())):
                    break
                time.sleep(0.5)
            # the router refuses the odd worker at registration (logging the
            # field) or refuses the pair (/health names the field)
            logged = [ln for ln in procs.log(rname).splitlines()
                      if "refused" in ln and d in ln and any(w in ln for w in words)]
            check(not ever_ready, "router with pf/%s never ready" % d)
            check(last is not None and last[0] == 503 and
                  (any(w in last[1] for w in words) or logged),
                  "router refuses pf/%s with a clear error: /health %r; log %r"
                  % (d, last, logged[:1]))
            _, models = http("GET", base + "/v1/models", timeout=5)
            name = models.get("data", [{}])[0].get("id", "")
            t0 = time.monotonic()
            code, body = http("POST", base + "/v1/completions",
                              {"model": name, "prompt": "Hello", "max_tokens": 2}, timeout=30)
            dt = time.monotonic() - t0
            check(code >= 500 and dt < 10, "completion on pf/%s fails fast: HTTP %d in %.1f s: %s"
                  % (d, code, dt, str(body)[:200]))
            for n in (rname, "pf-" + d, d):
                procs.stop(n)
    finally:
        codes = procs.stop_all()
    # the refusal is fast, so a worker may still be loading its model (no
    # handler installed yet: plain SIGTERM death, -15) when it is stopped
    check(all(c in (0, -15) for c in codes.values()),
          "processes exit on SIGTERM, cleanly once started (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, list(procs.procs))


def scenario_disagg_abort():
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("disagg_abort"))
    try:
        p, d = start_disagg(procs, router, extra_p=["--max-batch-tokens", "32"])
        router.wait_registered([p, d], timeout=120)
        prompt = long_prompt(800)
        idle = [(p, lambda: router.n_cached(p)), (d, lambda: 0)]
        # during prefill
        rid = router.submit(p, d, prompt, 4)
        time.sleep(1.0)  # inside the prefill: the tokens at 32 per step take many steps
        abort_and_check(router, rid, [p, d], idle, "abort during prefill")
        pd = router.request(rid).prefill_done
        check(pd is None or pd["status"] != 0, "the abort came before the prefill finished")
        # during transfer: the KV of a finished prefill is on its way (or waits
        # for the destination); abort as soon as the prefill worker has computed
        n_hb0 = router.workers[p]["n_hb"]
        rid = router.submit(p, d, prompt[:200], 4)
        router.wait_for(lambda: (router.workers[p]["n_hb"] > n_hb0 + 1
                                 and router.heartbeat(p)["queued_prefill_tokens"] == 0)
                        or router.request(rid).prefill_done is not None, 60, "prefill compute")
        abort_and_check(router, rid, [p, d], idle, "abort during transfer")
        # during decode
        rid = router.submit(p, d, prompt[:40], 400)
        router.wait_for(lambda: len(router.request(rid).tokens) >= 2, 180, "decode to start")
        abort_and_check(router, rid, [p, d], idle, "abort during decode")
        rid = router.submit(p, d, prompt[:20], 4)
        [r] = router.wait_done([rid], timeout=180)
        check(r.finished["status"] == 0 and len(r.tokens) == 4, "serves after aborts")
    finally:
        codes = procs.stop_all()
        router.close()
    check(all(c == 0 for c in codes.values()), "workers exit cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, ["pf", "dc"])


def scenario_disagg_kill_decode():
    router = fr.FakeRouter()
    procs = fr.Procs(log_dir("disagg_kill_decode"))
    try:
        p, d = start_disagg(procs, router, extra_p=["--max-batch-tokens", "32"])
        procs.start_worker("dc2", "decode", router.endpoint)
        router.wait_registered([p, d, "dc2"], timeout=120)
        prompt = long_prompt(800)
        rid = router.submit(p, d, prompt, 4)
        # the destination is known once D reserved; kill D while P computes and
        # streams layers into it
        time.sleep(1.0)  # inside the prefill: the tokens at 32 per step take many steps
        procs.kill(d)
        t_kill = time.monotonic()
        router.wait_for(lambda: router.request(rid).prefill_done is not None
                        or router.request(rid).finished is not None, 30,
                        "the prefill worker to report the failure")
        r = router.request(rid)
        rep = r.prefill_done or r.finished
        dt = (r.t_prefill_done or r.t_done) - t_kill
        check(rep["status"] != 0, "prefill worker reports failure: %s" % rep.get("error"))
        check(dt < 5.0, "reported within 5 s of the kill (%.2f s)" % dt)
        hb = wait_idle(router, p, lambda: router.n_cached(p))
        check(hb.get("used_blocks", 0) == router.n_cached(p),
              "prefill worker freed the request's blocks (used %d == cached %d)"
              % (hb.get("used_blocks", 0), router.n_cached(p)))
        rid = router.submit(p, "dc2", prompt[:30], 4)
        [r] = router.wait_done([rid], timeout=180)
        check(r.finished["status"] == 0 and len(r.tokens) == 4,
              "prefill worker keeps serving with another decode worker")
    finally:
        codes = procs.stop_all()
        router.close()
    codes.pop("dc", None)  # killed on purpose
    check(all(c == 0 for c in codes.values()), "workers exit cleanly on SIGTERM (%s)" % codes)
    if FAILURES:
        fail_with_logs(procs, ["pf", "dc", "dc2"])


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items()
             if name.startswith("scenario_")}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        print("usage: test_workers.py {%s}" % ",".join(sorted(SCENARIOS)))
        return 2
    t0 = time.monotonic()
    fr.exit_on_sigterm()
    try:
        SCENARIOS[sys.argv[1]]()
    except Exception as e:  # noqa: BLE001 (report any failure as a test failure)
        import traceback
        traceback.print_exc()
        FAILURES.append(repr(e))
    print("%s: %d failure(s) in %.1f s" % (sys.argv[1], len(FAILURES), time.monotonic() - t0))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
