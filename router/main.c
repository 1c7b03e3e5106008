/* baton-router: the OpenAI-compatible front door of a baton cluster.
 * Options: see usage() (and router/server.h for what each does). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "common/log.h"
#include "router/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: baton-router --model FILE [options]\n"
            "  --http-bind HOST:PORT        HTTP listen address (default 127.0.0.1:8000)\n"
            "  --control-bind ENDPOINT      ZeroMQ ROUTER for workers (default tcp://127.0.0.1:5600)\n"
            "  --model FILE                 GGUF file (tokenizer and metadata only)\n"
            "  --served-model-name NAME     model id clients use (default: general.name or file stem)\n"
            "  --policy P                   cache_aware (default), round_robin, least_loaded\n"
            "  --block-size N               tokens per KV block (default 16; must match workers)\n"
            "  --hash-seed S                64-bit block-hash secret (default 0; must match workers)\n"
            "  --max-body-bytes N           larger request bodies get 413 (default 4194304)\n"
            "  --request-timeout-ms N       whole-request deadline (default 600000)\n"
            "  --first-token-timeout-ms N   routed -> first token deadline (default 120000)\n"
            "  --token-timeout-ms N         deadline between tokens (default 30000)\n"
            "  --worker-timeout-ms N        drop workers silent this long (default 10000)\n"
            "  --http-timeout-s N           slow-client read/write timeout (default 60)\n"
            "  --balance-abs-tokens N       cache_aware balance guard, absolute (default 4096)\n"
            "  --balance-rel X              cache_aware balance guard, relative (default 2.0)\n"
            "  --api-keys K1,K2             require Authorization: Bearer <key> on /v1/*\n");
}

static int parse_u64(const char *s, const char *name, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || !*s || *end || s[0] == '-') {
        fprintf(stderr, "baton-router: %s: '%s' is not a non-negative integer\n", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    LOG_INFO("router", "signal %d: shutting down", (int)sig);
    event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv) {
    router_config_t cfg;
    router_config_default(&cfg);
    enum {
        O_HTTP = 1000, O_CONTROL, O_MODEL, O_NAME, O_POLICY, O_BLOCK, O_SEED, O_BODY, O_REQ_TO,
        O_FT_TO, O_TOK_TO, O_W_TO, O_HTTP_TO, O_BAL_ABS, O_BAL_REL, O_KEYS, O_HELP
    };
    static const struct option opts[] = {
        {"http-bind", required_argument, 0, O_HTTP},
        {"control-bind", required_argument, 0, O_CONTROL},
        {"model", required_argument, 0, O_MODEL},
        {"served-model-name", required_argument, 0, O_NAME},
        {"policy", required_argument, 0, O_POLICY},
        {"block-size", required_argument, 0, O_BLOCK},
        {"hash-seed", required_argument, 0, O_SEED},
        {"max-body-bytes", required_argument, 0, O_BODY},
        {"request-timeout-ms", required_argument, 0, O_REQ_TO},
        {"first-token-timeout-ms", required_argument, 0, O_FT_TO},
        {"token-timeout-ms", required_argument, 0, O_TOK_TO},
        {"worker-timeout-ms", required_argument, 0, O_W_TO},
        {"http-timeout-s", required_argument, 0, O_HTTP_TO},
        {"balance-abs-tokens", required_argument, 0, O_BAL_ABS},
        {"balance-rel", required_argument, 0, O_BAL_REL},
        {"api-keys", required_argument, 0, O_KEYS},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_HTTP: cfg.http_bind = optarg; break;
        case O_CONTROL: cfg.control_bind = optarg; break;
        case O_MODEL: cfg.model_path = optarg; break;
        case O_NAME: cfg.served_model_name = optarg; break;
        case O_POLICY:
            if (route_policy_parse(optarg, &cfg.route.policy) != BATON_OK) {
                fprintf(stderr, "baton-router: %s\n", baton_last_error());
                return 2;
            }
            break;
        case O_BLOCK:
            if (parse_u64(optarg, "--block-size", &v) || v == 0 || v > 4096) {
                fprintf(stderr, "baton-router: --block-size must be in 1..4096\n");
                return 2;
            }
            cfg.block_size = (uint32_t)v;
            break;
        case O_SEED:
            if (parse_u64(optarg, "--hash-seed", &cfg.hash_seed))
                return 2;
            break;
        case O_BODY:
            if (parse_u64(optarg, "--max-body-bytes", &v) || v == 0) {
                fprintf(stderr, "baton-router: --max-body-bytes must be > 0\n");
                return 2;
            }
            cfg.max_body_bytes = (size_t)v;
            break;
        case O_REQ_TO:
            if (parse_u64(optarg, "--request-timeout-ms", &cfg.request_timeout_ms))
                return 2;
            break;
        case O_FT_TO:
            if (parse_u64(optarg, "--first-token-timeout-ms", &cfg.first_token_timeout_ms))
                return 2;
            break;
        case O_TOK_TO:
            if (parse_u64(optarg, "--token-timeout-ms", &cfg.token_timeout_ms))
                return 2;
            break;
        case O_W_TO:
            if (parse_u64(optarg, "--worker-timeout-ms", &cfg.worker_timeout_ms))
                return 2;
            break;
        case O_HTTP_TO:
            if (parse_u64(optarg, "--http-timeout-s", &v) || v == 0 || v > 86400) {
                fprintf(stderr, "baton-router: --http-timeout-s must be in 1..86400\n");
                return 2;
            }
            cfg.http_timeout_s = (int)v;
            break;
        case O_BAL_ABS:
            if (parse_u64(optarg, "--balance-abs-tokens", &cfg.route.balance_abs_tokens))
                return 2;
            break;
        case O_BAL_REL: {
            char *end;
            cfg.route.balance_rel = strtod(optarg, &end);
            if (*end || cfg.route.balance_rel < 1.0) {
                fprintf(stderr, "baton-router: --balance-rel must be a number >= 1\n");
                return 2;
            }
            break;
        }
        case O_KEYS: cfg.api_keys = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc || !cfg.model_path) {
        usage(stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    if (!base) {
        fprintf(stderr, "baton-router: event_base_new failed\n");
        return 1;
    }
    router_server_t *srv = NULL;
    baton_status_t st = router_server_init(&cfg, base, &srv);
    if (st != BATON_OK) {
        fprintf(stderr, "baton-router: %s: %s\n", baton_status_str(st), baton_last_error());
        event_base_free(base);
        return 1;
    }
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    event_add(sigint, NULL);
    event_add(sigterm, NULL);
    event_base_dispatch(base);
    router_server_free(srv);
    event_free(sigint);
    event_free(sigterm);
    event_base_free(base);
    return 0;
}
