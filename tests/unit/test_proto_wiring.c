/* Round trip of the optional wiring fields added for the prefill/decode/
 * router cluster (cluster.md): WorkerRegister.kv_events_endpoint, heartbeat
 * metrics, PrefillRequest.decode_endpoint, DecodeRequest.prefill_endpoint,
 * KVDestination.ucx_address. Values are set here, encoded, decoded and
 * compared field by field. */
#include <string.h>

#include "proto/messages.h"
#include "tests/test_util.h"

static proto_limits_t lim;

static void roundtrip(const proto_msg_t *in, proto_msg_t *out) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    CHECK_OK(proto_encode(in, &sb));
    memset(out, 0, sizeof(*out));
    CHECK_OK(proto_decode(sb.data, sb.size, &lim, out));
    msgpack_sbuffer_destroy(&sb);
}

int main(void) {
    proto_limits_default(1000, &lim);
    proto_msg_t in, out;

    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_WORKER_REGISTER;
    proto_worker_register_t *r = &in.u.worker_register;
    strcpy(r->worker_id, "prefill-a");
    r->epoch = 7;
    r->zmq_endpoint = "tcp://127.0.0.1:5601";
    r->vocab_size = 1000;
    r->kv = (proto_kv_geometry_t){2, 2, 16, 16, PROTO_KV_DTYPE_F32, 99};
    r->kv_events_endpoint = "tcp://127.0.0.1:5602";
    roundtrip(&in, &out);
    CHECK(out.u.worker_register.kv_events_endpoint &&
          !strcmp(out.u.worker_register.kv_events_endpoint, "tcp://127.0.0.1:5602"));
    CHECK(out.u.worker_register.max_batch == 0 &&
          (!out.u.worker_register.cpu_model || !out.u.worker_register.cpu_model[0]));
    proto_msg_free(&out);
    /* issue 6: serving configuration in the registration */
    r->max_batch_tokens = 512;
    r->max_batch = 64;
    r->cpu_model = "AMD EPYC 7B13";
    r->backend = "cpu";
    r->compute_dtype = "q4_1";
    roundtrip(&in, &out);
    CHECK_EQ_INT(out.u.worker_register.max_batch_tokens, 512);
    CHECK_EQ_INT(out.u.worker_register.max_batch, 64);
    CHECK(out.u.worker_register.cpu_model && !strcmp(out.u.worker_register.cpu_model, "AMD EPYC 7B13"));
    CHECK(out.u.worker_register.backend && !strcmp(out.u.worker_register.backend, "cpu"));
    CHECK(out.u.worker_register.compute_dtype && !strcmp(out.u.worker_register.compute_dtype, "q4_1"));
    proto_msg_free(&out);

    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_WORKER_HEARTBEAT;
    proto_worker_heartbeat_t *h = &in.u.worker_heartbeat;
    strcpy(h->worker_id, "prefill-a");
    h->epoch = 7;
    h->free_blocks = 10;
    h->total_blocks = 20;
    h->used_blocks = 10;
    h->cache_hit_blocks = 1ull << 40;
    h->cache_lookup_blocks = (1ull << 40) + 5;
    h->preemptions = 3;
    h->busy_us = 123456789;
    h->steps = 4242;
    roundtrip(&in, &out);
    const proto_worker_heartbeat_t *ho = &out.u.worker_heartbeat;
    CHECK_EQ_INT(ho->used_blocks, 10);
    CHECK(ho->cache_hit_blocks == 1ull << 40);
    CHECK(ho->cache_lookup_blocks == (1ull << 40) + 5);
    CHECK_EQ_INT(ho->preemptions, 3);
    CHECK_EQ_INT(ho->busy_us, 123456789);
    CHECK_EQ_INT(ho->steps, 4242);
    proto_msg_free(&out);

    uint32_t toks[3] = {1, 2, 999};
    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_PREFILL_REQUEST;
    proto_prefill_request_t *p = &in.u.prefill_request;
    strcpy(p->decode_worker_id, "decode-b");
    p->token_ids = toks;
    p->n_token_ids = 3;
    p->sampling.top_p = 1;
    p->sampling.repetition_penalty = 1;
    p->sampling.max_tokens = 4;
    p->decode_endpoint = "tcp://10.0.0.2:7000";
    proto_sampling_t samp = p->sampling;
    roundtrip(&in, &out);
    CHECK(out.u.prefill_request.decode_endpoint &&
          !strcmp(out.u.prefill_request.decode_endpoint, "tcp://10.0.0.2:7000"));
    proto_msg_free(&out);

    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_DECODE_REQUEST;
    proto_decode_request_t *d = &in.u.decode_request;
    strcpy(d->prefill_worker_id, "prefill-a");
    d->n_prompt_tokens = 3;
    d->n_blocks = 1;
    d->sampling = samp;
    d->prefill_endpoint = "tcp://10.0.0.1:7001";
    roundtrip(&in, &out);
    CHECK(out.u.decode_request.prefill_endpoint &&
          !strcmp(out.u.decode_request.prefill_endpoint, "tcp://10.0.0.1:7001"));
    proto_msg_free(&out);

    uint32_t blocks[2] = {5, 9};
    uint8_t addr[37];
    for (int i = 0; i < 37; i++) addr[i] = (uint8_t)(i * 7 + 1);
    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_KV_DESTINATION;
    proto_kv_destination_t *k = &in.u.kv_destination;
    strcpy(k->decode_worker_id, "decode-b");
    k->decode_epoch = 3;
    k->block_ids = blocks;
    k->n_block_ids = 2;
    k->ucx_address = addr;
    k->ucx_address_len = 37;
    roundtrip(&in, &out);
    CHECK_EQ_INT(out.u.kv_destination.ucx_address_len, 37);
    CHECK(out.u.kv_destination.ucx_address &&
          !memcmp(out.u.kv_destination.ucx_address, addr, 37));
    proto_msg_free(&out);

    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_PREFILL_DONE;
    proto_prefill_done_t *pd = &in.u.prefill_done;
    strcpy(pd->prefill_worker_id, "prefill-a");
    pd->first_token = 5;
    pd->first_logprob = -0.5f;
    pd->cached_tokens = 48;
    roundtrip(&in, &out);
    CHECK_EQ_INT(out.u.prefill_done.cached_tokens, 48);
    CHECK_EQ_INT(out.u.prefill_done.device_us, 0); /* absent: 0 */
    proto_msg_free(&out);
    pd->device_us = 5000000123ull; /* > 2^32: a full u64 on the wire */
    roundtrip(&in, &out);
    CHECK(out.u.prefill_done.device_us == 5000000123ull);
    proto_msg_free(&out);

    /* issue 6: RequestFinished device-seconds */
    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_REQUEST_FINISHED;
    proto_request_finished_t *rf = &in.u.request_finished;
    strcpy(rf->worker_id, "decode-a");
    rf->finish_reason = PROTO_FINISH_LENGTH;
    rf->prompt_tokens = 10;
    rf->completion_tokens = 4;
    roundtrip(&in, &out);
    CHECK(out.u.request_finished.prefill_device_us == 0 && out.u.request_finished.decode_device_us == 0);
    proto_msg_free(&out);
    rf->prefill_device_us = 71234;
    rf->decode_device_us = 13001;
    roundtrip(&in, &out);
    CHECK(out.u.request_finished.prefill_device_us == 71234);
    CHECK(out.u.request_finished.decode_device_us == 13001);
    proto_msg_free(&out);

    /* issue 6: heartbeat idle gaps */
    memset(&in, 0, sizeof(in));
    in.type = PROTO_MSG_WORKER_HEARTBEAT;
    proto_worker_heartbeat_t *hb = &in.u.worker_heartbeat;
    strcpy(hb->worker_id, "decode-a");
    hb->role = PROTO_ROLE_DECODE;
    hb->epoch = 1;
    hb->idle_gaps = 7;
    hb->idle_gap_us = 7000;
    hb->idle_gap_max_us = 2500;
    roundtrip(&in, &out);
    CHECK(out.u.worker_heartbeat.idle_gaps == 7 && out.u.worker_heartbeat.idle_gap_us == 7000 &&
          out.u.worker_heartbeat.idle_gap_max_us == 2500);
    proto_msg_free(&out);
    return TEST_DONE();
}
