/* baton-prefill: the prefill worker process (prefill_worker.h).
 *
 * Usage: baton-prefill --router tcp://HOST:PORT --model FILE [options]
 *   --router EP                   the router's control endpoint (ROUTER socket)
 *   --model FILE                  GGUF model
 *   --worker-id ID                default prefill-<hostname>-<pid>
 *   --peer-bind EP                worker-to-worker ROUTER (default tcp://127.0.0.1:*)
 *   --peer-advertise EP           endpoint advertised in WorkerRegister.zmq_endpoint
 *   --kv-events-bind EP           KV-event PUB socket (default tcp://127.0.0.1:*)
 *   --kv-events-advertise EP      endpoint advertised as kv_events_endpoint
 *   --backend cpu|cuda            default cpu
 *   --threads N                   compute threads (0 = all CPUs)
 *   --block-size N                tokens per KV block (default 16)
 *   --kv-blocks N                 KV pool size in blocks (default 1024)
 *   --hash-seed S                 64-bit block-hash cluster secret (default 0)
 *   --max-batch-tokens N          token budget of one prefill step (default 512)
 *   --kv-destination-timeout-ms N wait for KVDestination after the prompt (default 10000)
 *   --transfer-timeout-ms N       bound of one request's UCX transfer (default 30000)
 *   --heartbeat-ms N              heartbeat period (default 500)
 * Exit status: 0 after SIGTERM/SIGINT, 2 on a usage error, 1 when start-up
 * fails (the reason is logged). */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "prefill_worker/prefill_worker.h"

static int parse_u64(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || !end || *end || s[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "baton-prefill: %s: '%s' is not a number in [%llu, %llu]\n", name, s,
                (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: baton-prefill --router tcp://HOST:PORT --model FILE [--worker-id ID]\n"
               "  [--peer-bind EP] [--peer-advertise EP] [--kv-events-bind EP]\n"
               "  [--kv-events-advertise EP] [--backend cpu|cuda] [--threads N]\n"
               "  [--block-size N] [--kv-blocks N] [--hash-seed S] [--max-batch-tokens N]\n"
               "  [--kv-destination-timeout-ms N] [--transfer-timeout-ms N] [--heartbeat-ms N]\n");
}

int main(int argc, char **argv) {
    prefill_worker_config_t cfg = prefill_worker_config_default();
    enum { O_ROUTER = 256, O_MODEL, O_ID, O_PBIND, O_PADV, O_EBIND, O_EADV, O_BACKEND, O_THREADS,
           O_BS, O_BLOCKS, O_SEED, O_MBT, O_DEST, O_XFER, O_HB, O_HELP };
    static const struct option opts[] = {
        {"router", required_argument, 0, O_ROUTER},
        {"model", required_argument, 0, O_MODEL},
        {"worker-id", required_argument, 0, O_ID},
        {"peer-bind", required_argument, 0, O_PBIND},
        {"peer-advertise", required_argument, 0, O_PADV},
        {"kv-events-bind", required_argument, 0, O_EBIND},
        {"kv-events-advertise", required_argument, 0, O_EADV},
        {"backend", required_argument, 0, O_BACKEND},
        {"threads", required_argument, 0, O_THREADS},
        {"block-size", required_argument, 0, O_BS},
        {"kv-blocks", required_argument, 0, O_BLOCKS},
        {"hash-seed", required_argument, 0, O_SEED},
        {"max-batch-tokens", required_argument, 0, O_MBT},
        {"kv-destination-timeout-ms", required_argument, 0, O_DEST},
        {"transfer-timeout-ms", required_argument, 0, O_XFER},
        {"heartbeat-ms", required_argument, 0, O_HB},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_ROUTER: cfg.router = optarg; break;
        case O_MODEL: cfg.model = optarg; break;
        case O_ID: cfg.worker_id = optarg; break;
        case O_PBIND: cfg.peer_bind = optarg; break;
        case O_PADV: cfg.peer_advertise = optarg; break;
        case O_EBIND: cfg.kv_events_bind = optarg; break;
        case O_EADV: cfg.kv_events_advertise = optarg; break;
        case O_BACKEND: cfg.backend = optarg; break;
        case O_THREADS:
            if (parse_u64("--threads", optarg, 0, 1024, &v)) return 2;
            cfg.threads = (int)v;
            break;
        case O_BS:
            if (parse_u64("--block-size", optarg, 1, 4096, &v)) return 2;
            cfg.block_size = (int32_t)v;
            break;
        case O_BLOCKS:
            if (parse_u64("--kv-blocks", optarg, 1, 1u << 24, &v)) return 2;
            cfg.kv_blocks = (int32_t)v;
            break;
        case O_SEED:
            if (parse_u64("--hash-seed", optarg, 0, UINT64_MAX, &v)) return 2;
            cfg.hash_seed = v;
            break;
        case O_MBT:
            if (parse_u64("--max-batch-tokens", optarg, 1, 1u << 20, &v)) return 2;
            cfg.max_batch_tokens = (int32_t)v;
            break;
        case O_DEST:
            if (parse_u64("--kv-destination-timeout-ms", optarg, 1, 86400000, &v)) return 2;
            cfg.kv_destination_timeout_ms = (uint32_t)v;
            break;
        case O_XFER:
            if (parse_u64("--transfer-timeout-ms", optarg, 1, 86400000, &v)) return 2;
            cfg.transfer_timeout_ms = (uint32_t)v;
            break;
        case O_HB:
            if (parse_u64("--heartbeat-ms", optarg, 1, 3600000, &v)) return 2;
            cfg.heartbeat_ms = (uint32_t)v;
            break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || !cfg.router || !cfg.model) {
        usage(stderr);
        return 2;
    }
    baton_status_t st = prefill_worker_run(&cfg);
    if (st != BATON_OK) {
        LOG_ERROR("prefill", "start-up failed: %s", baton_last_error());
        return 1;
    }
    return 0;
}
