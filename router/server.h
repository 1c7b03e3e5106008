/* router: the baton-router process: HTTP front door (libevent evhttp), the
 * ZeroMQ control socket the workers connect to, the KV-event subscriber,
 * and the glue between them (worker table, global radix index, routing,
 * request state machines, streaming, metrics).
 *
 * HTTP endpoints: POST /v1/chat/completions, POST /v1/completions,
 * GET /v1/models, GET /health (200 when a prefill/decode pair or a
 * colocated worker is ready, 503 with the reason otherwise), GET /metrics
 * (Prometheus text), POST /tokenize {"prompt"|"messages", "add_special_tokens"}
 * -> {"tokens","count","max_model_len"} and POST /detokenize {"tokens"} ->
 * {"prompt"} (vLLM's shapes). Everything runs on one event loop thread. */
#ifndef BATON_ROUTER_SERVER_H
#define BATON_ROUTER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "common/status.h"
#include "router/route.h"

typedef struct router_config {
    const char *http_bind;         /* "HOST:PORT", default 127.0.0.1:8000 */
    const char *control_bind;      /* ZeroMQ ROUTER endpoint, default tcp://127.0.0.1:5600 */
    const char *model_path;        /* GGUF file (tokenizer + metadata only) */
    const char *served_model_name; /* NULL: general.name, else the file stem */
    route_config_t route;
    uint32_t block_size;           /* tokens per KV block, default 16 */
    uint64_t hash_seed;            /* block-hash cluster secret */
    size_t max_body_bytes;         /* request bodies above get 413 */
    uint64_t request_timeout_ms;   /* whole request deadline */
    uint64_t first_token_timeout_ms; /* routed -> first token */
    uint64_t token_timeout_ms;     /* between tokens */
    uint64_t worker_timeout_ms;    /* heartbeat silence before a worker is dropped */
    int http_timeout_s;            /* slow-client read/write timeout */
    const char *api_keys;          /* comma-separated bearer keys, NULL = open */
} router_config_t;

/* Defaults for every field (model_path NULL). */
void router_config_default(router_config_t *cfg);

typedef struct router_server router_server_t;

/* Loads the tokenizer and chat template from cfg->model_path, binds the
 * HTTP and control endpoints on `base` and registers their events. The
 * strings in cfg must outlive the server. Errors: BATON_ERR_IO (bind
 * failed, model file unreadable), BATON_ERR_FORMAT (bad model file),
 * BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY. */
baton_status_t router_server_init(const router_config_t *cfg, struct event_base *base,
                                  router_server_t **out);

/* Port the HTTP server is listening on (useful with port 0). */
int router_server_http_port(const router_server_t *srv);

/* Stops serving, aborts every in-flight request on its workers, frees
 * everything. NULL-safe. */
void router_server_free(router_server_t *srv);

#endif
