/* baton-decode: the decode worker (issue 4, cluster.md).
 *
 * Usage: baton-decode --router tcp://HOST:PORT --model FILE [options]
 *
 *   --router EP              the router's control endpoint (required)
 *   --model FILE             GGUF model (required; its SHA-256 is sent in
 *                            WorkerRegister and must match the prefill side)
 *   --worker-id ID           default decode-<hostname>-<pid>
 *   --peer-bind EP           ROUTER socket for PrefillDone from prefill
 *                            workers (default tcp://127.0.0.1:*)
 *   --peer-advertise EP      endpoint announced in WorkerRegister.zmq_endpoint
 *                            (default: the bound one)
 *   --backend cpu|cuda       default cpu
 *   --threads N              compute threads (default 0 = all CPUs)
 *   --block-size N           tokens per KV block (default 16)
 *   --kv-blocks N            KV pool size in blocks (default 1024)
 *   --hash-seed S            block-hash cluster secret; only its public id
 *                            XXH3-64(le bytes) is sent (default 0)
 *   --max-batch N            running sequences per decode step (default 64)
 *   --watermark-blocks N     growth blocks reserved with each prompt (default 1)
 *   --prefill-timeout-ms MS  reservation -> PrefillDone bound (default 30000)
 *   --heartbeat-ms MS        WorkerHeartbeat period (default 500)
 *   --max-context N          longest sequence (default: the model's context)
 *
 * Exit status: 0 after SIGTERM/SIGINT, 1 when start-up failed, 2 on bad
 * options. */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "decode_worker/decode_worker.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: baton-decode --router tcp://HOST:PORT --model FILE [--worker-id ID]\n"
            "  [--peer-bind EP] [--peer-advertise EP] [--backend cpu|cuda] [--threads N]\n"
            "  [--block-size N] [--kv-blocks N] [--hash-seed S] [--max-batch N]\n"
            "  [--watermark-blocks N] [--prefill-timeout-ms MS] [--heartbeat-ms MS]\n"
            "  [--max-context N]\n");
}

/* Parses a whole decimal/hex integer in [lo, hi]; false otherwise. */
static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    decode_worker_config_t c = decode_worker_config_default();
    enum { O_ROUTER = 1, O_MODEL, O_ID, O_PBIND, O_PADV, O_BACKEND, O_THREADS, O_BS, O_KVB, O_SEED,
           O_MAXB, O_WM, O_PTO, O_HB, O_CTX, O_HELP };
    static const struct option opts[] = {
        {"router", required_argument, 0, O_ROUTER}, {"model", required_argument, 0, O_MODEL},
        {"worker-id", required_argument, 0, O_ID}, {"peer-bind", required_argument, 0, O_PBIND},
        {"peer-advertise", required_argument, 0, O_PADV}, {"backend", required_argument, 0, O_BACKEND},
        {"threads", required_argument, 0, O_THREADS}, {"block-size", required_argument, 0, O_BS},
        {"kv-blocks", required_argument, 0, O_KVB}, {"hash-seed", required_argument, 0, O_SEED},
        {"max-batch", required_argument, 0, O_MAXB}, {"watermark-blocks", required_argument, 0, O_WM},
        {"prefill-timeout-ms", required_argument, 0, O_PTO},
        {"heartbeat-ms", required_argument, 0, O_HB}, {"max-context", required_argument, 0, O_CTX},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    int o;
    uint64_t v;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        bool ok = true;
        switch (o) {
        case O_ROUTER: c.router = optarg; break;
        case O_MODEL: c.model = optarg; break;
        case O_ID: c.worker_id = optarg; break;
        case O_PBIND: c.peer_bind = optarg; break;
        case O_PADV: c.peer_advertise = optarg; break;
        case O_BACKEND: c.backend = optarg; break;
        case O_THREADS: ok = parse_u64(optarg, 0, 1024, &v) && ((c.threads = (int)v), true); break;
        case O_BS: ok = parse_u64(optarg, 1, 4096, &v) && ((c.block_size = (int32_t)v), true); break;
        case O_KVB: ok = parse_u64(optarg, 1, 1 << 24, &v) && ((c.kv_blocks = (int32_t)v), true); break;
        case O_SEED: ok = parse_u64(optarg, 0, UINT64_MAX, &c.hash_seed); break;
        case O_MAXB: ok = parse_u64(optarg, 1, 4096, &v) && ((c.max_batch = (int32_t)v), true); break;
        case O_WM: ok = parse_u64(optarg, 0, 1 << 20, &v) && ((c.watermark_blocks = (int32_t)v), true); break;
        case O_PTO: ok = parse_u64(optarg, 1, 86400000, &v) && ((c.prefill_timeout_ms = (uint32_t)v), true); break;
        case O_HB: ok = parse_u64(optarg, 10, 60000, &v) && ((c.heartbeat_ms = (uint32_t)v), true); break;
        case O_CTX: ok = parse_u64(optarg, 0, 1 << 24, &v) && ((c.max_context = (int32_t)v), true); break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "baton-decode: bad value '%s' for --%s\n", optarg, opts[o - 1].name);
            return 2;
        }
    }
    if (optind < argc || !c.router || !c.model) {
        usage(stderr);
        return 2;
    }
    baton_status_t st = decode_worker_run(&c);
    if (st != BATON_OK) {
        LOG_ERROR("decode", "start-up failed: %s", baton_last_error());
        return 1;
    }
    return 0;
}
