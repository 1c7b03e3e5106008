/* Helper for tests/unit/test_proto_py.py (a cross-check with an independent
 * msgpack implementation, Python's msgpack):
 *   proto_emit encode   writes fixed PrefillRequest and KVEvent messages
 *                       (values listed in the Python test) to stdout, each
 *                       preceded by its length as 4 big-endian bytes;
 *   proto_emit decode   reads one message from stdin, decodes it with
 *                       vocab 1000 and prints its fields as one line, or
 *                       "error <status>" and exits 1. */
#include <stdio.h>
#include <string.h>

#include "proto/messages.h"

static void emit(const proto_msg_t *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (proto_encode(m, &sb) != BATON_OK) {
        fprintf(stderr, "encode: %s\n", baton_last_error());
        return;
    }
    unsigned char len[4] = {(unsigned char)(sb.size >> 24), (unsigned char)(sb.size >> 16),
                            (unsigned char)(sb.size >> 8), (unsigned char)sb.size};
    fwrite(len, 1, 4, stdout);
    fwrite(sb.data, 1, sb.size, stdout);
    msgpack_sbuffer_destroy(&sb);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "encode")) {
        uint32_t tokens[] = {1, 2, 999};
        uint32_t stop[] = {2};
        proto_msg_t p = {.type = PROTO_MSG_PREFILL_REQUEST};
        proto_prefill_request_t *r = &p.u.prefill_request;
        for (int i = 0; i < 16; i++) r->request_id.bytes[i] = (uint8_t)i;
        strcpy(r->decode_worker_id, "decode-0");
        r->decode_epoch = 5;
        r->token_ids = tokens;
        r->n_token_ids = 3;
        r->sampling = (proto_sampling_t){.temperature = 0.5f, .top_p = 0.75f, .top_k = 40,
                                         .min_p = 0.0f, .repetition_penalty = 1.0f,
                                         .presence_penalty = -0.5f, .frequency_penalty = 0.25f,
                                         .seed = 18446744073709551615ull, .max_tokens = 16,
                                         .stop_token_ids = stop, .n_stop_token_ids = 1,
                                         .logprobs = true, .top_logprobs = 2, .ignore_eos = false};
        r->tenant = "acme";
        r->cache_salt = 0;
        r->deadline_unix_us = 1700000000000000ull;
        emit(&p);
        proto_block_hash_t removed[1];
        memset(removed, 0xab, sizeof(removed));
        proto_kv_stored_t stored[1];
        memset(stored, 0, sizeof(stored));
        memset(stored[0].hash.bytes, 0x11, 16);
        stored[0].n_tokens = 16;
        proto_msg_t e = {.type = PROTO_MSG_KV_EVENT};
        strcpy(e.u.kv_event.worker_id, "prefill-1");
        e.u.kv_event.epoch = 2;
        e.u.kv_event.seq = 300;
        e.u.kv_event.stored = stored;
        e.u.kv_event.n_stored = 1;
        e.u.kv_event.removed = removed;
        e.u.kv_event.n_removed = 1;
        emit(&e);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "decode")) {
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof(buf), stdin);
        proto_limits_t lim;
        proto_limits_default(1000, &lim);
        proto_msg_t m;
        baton_status_t st = proto_decode(buf, n, &lim, &m);
        if (st) {
            printf("error %d\n", st);
            return 1;
        }
        if (m.type == PROTO_MSG_TOKEN_CHUNK) {
            const proto_token_chunk_t *c = &m.u.token_chunk;
            printf("token_chunk %s step=%llu entries=%u", c->worker_id,
                   (unsigned long long)c->step_id, c->n_entries);
            for (uint32_t i = 0; i < c->n_entries; i++) {
                printf(" [rid0=%u tokens=", c->entries[i].request_id.bytes[0]);
                for (uint32_t j = 0; j < c->entries[i].n_token_ids; j++)
                    printf("%s%u", j ? "," : "", c->entries[i].token_ids[j]);
                printf(" lp=");
                for (uint32_t j = 0; j < c->entries[i].n_logprobs; j++)
                    printf("%s%g", j ? "," : "", c->entries[i].logprobs[j]);
                printf(" finish=%d]", c->entries[i].finish_reason);
            }
            printf("\n");
        } else {
            printf("%s\n", proto_msg_type_name(m.type));
        }
        proto_msg_free(&m);
        return 0;
    }
    fprintf(stderr, "usage: proto_emit encode|decode\n");
    return 2;
}
