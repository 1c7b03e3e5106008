/* Unit tests of the router's pure parts: OpenAI request parsing and error
 * bodies (the OpenAI API reference's shapes and ranges), the detokenizing
 * stream with stop strings (on the real SmolLM2 tokenizer; expectations
 * derived from the input text and OpenAI's stop semantics), the worker
 * table's pairing rules (cluster.md) and the routing policies. */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "common/gguf.h"
#include "common/tokenizer.h"
#include "router/http_api.h"
#include "router/route.h"
#include "router/stream.h"
#include "router/worker_table.h"
#include "tests/test_util.h"

static baton_status_t parse(const char *body, http_api_kind_t kind, http_api_params_t *p,
                            http_api_error_t *err) {
    memset(p, 0, sizeof(*p));
    memset(err, 0, sizeof(*err));
    return http_api_parse(body, strlen(body), kind, p, err);
}

static void expect_error(const char *body, http_api_kind_t kind, const char *param) {
    http_api_params_t p;
    http_api_error_t err;
    baton_status_t st = parse(body, kind, &p, &err);
    CHECK_MSG(st != BATON_OK, "accepted: %s", body);
    if (st == BATON_OK) {
        http_api_params_free(&p);
        return;
    }
    CHECK_EQ_INT(err.status, 400);
    CHECK_MSG(strcmp(err.param, param) == 0, "%s: param '%s', want '%s' (%s)", body, err.param,
              param, err.message);
    /* the body is OpenAI-shaped */
    char *json = http_api_error_json(&err);
    json_t *root = json_loads(json, 0, NULL);
    json_t *e = json_object_get(root, "error");
    CHECK(json_is_string(json_object_get(e, "message")));
    CHECK(json_is_string(json_object_get(e, "type")));
    CHECK(json_object_get(e, "param") != NULL && json_object_get(e, "code") != NULL);
    CHECK(param[0] ? json_is_string(json_object_get(e, "param"))
                   : json_is_null(json_object_get(e, "param")));
    json_decref(root);
    free(json);
}

static void test_http_api(void) {
    http_api_params_t p;
    http_api_error_t err;
    CHECK_OK(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                   "{\"type\":\"text\",\"text\":\"b\"}]}],\"max_completion_tokens\":7,"
                   "\"temperature\":0,\"top_p\":0.5,\"top_k\":40,\"min_p\":0.1,\"seed\":42,"
                   "\"stop\":[\"x\",\"yz\"],\"stream\":true,\"stream_options\":"
                   "{\"include_usage\":true},\"presence_penalty\":null,\"user\":\"u1\"}",
                   HTTP_API_CHAT, &p, &err));
    CHECK_EQ_INT(p.n_messages, 2);
    CHECK(!strcmp(p.messages[1].content, "ab") && p.messages[1].content_len == 2);
    CHECK_EQ_INT(p.max_tokens, 7);
    CHECK(p.temperature == 0.0f && p.top_p == 0.5f && p.top_k == 40);
    CHECK(p.has_seed && p.seed == 42);
    CHECK_EQ_INT(p.n_stop, 2);
    CHECK(p.stop_len[1] == 2 && !memcmp(p.stop[1], "yz", 2));
    CHECK(p.stream && p.include_usage && p.n == 1);
    CHECK(p.presence_penalty == 0.0f); /* null = absent */
    CHECK(p.user && !strcmp(p.user, "u1"));
    http_api_params_free(&p);
    http_api_params_free(&p); /* zeroed: second free is harmless */

    /* completions prompt forms */
    CHECK_OK(parse("{\"model\":\"m\",\"prompt\":\"hi\"}", HTTP_API_COMPLETIONS, &p, &err));
    CHECK(p.n_prompts == 1 && p.prompts[0].text && p.max_tokens == -1);
    http_api_params_free(&p);
    CHECK_OK(parse("{\"model\":\"m\",\"prompt\":[\"a\",\"b\",[1,2,3]],\"echo\":true}",
                   HTTP_API_COMPLETIONS, &p, &err));
    CHECK(p.n_prompts == 3 && p.prompts[2].n_ids == 3 && p.prompts[2].ids[2] == 3 && p.echo);
    http_api_params_free(&p);
    CHECK_OK(parse("{\"model\":\"m\",\"prompt\":[5,6]}", HTTP_API_COMPLETIONS, &p, &err));
    CHECK(p.n_prompts == 1 && p.prompts[0].n_ids == 2 && p.prompts[0].ids[0] == 5);
    http_api_params_free(&p);

    /* malformed JSON */
    CHECK_EQ_INT(parse("{\"model\":", HTTP_API_CHAT, &p, &err), BATON_ERR_FORMAT);
    CHECK_EQ_INT(err.status, 400);
    CHECK_EQ_INT(parse("[1,2]", HTTP_API_CHAT, &p, &err), BATON_ERR_FORMAT);
    /* unknown / unsupported keys are named, never ignored */
    CHECK_EQ_INT(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"tools\":[]}",
                       HTTP_API_CHAT, &p, &err),
                 BATON_ERR_UNSUPPORTED);
    CHECK(!strcmp(err.param, "tools"));
    /* logit_bias (OpenAI: token-id strings -> numbers in [-100, 100], <= 300 entries) */
    CHECK_OK(parse("{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"1\":5,\"49151\":-100,"
                   "\"0\":100,\"7\":-0.5}}",
                   HTTP_API_COMPLETIONS, &p, &err));
    CHECK_EQ_INT(p.n_logit_bias, 4);
    if (p.n_logit_bias == 4) {
        float want[4] = {5.0f, -100.0f, 100.0f, -0.5f};
        int32_t ids[4] = {1, 49151, 0, 7};
        for (int i = 0; i < 4; i++) { /* jansson keeps insertion order */
            CHECK_EQ_INT(p.logit_bias[i].token, ids[i]);
            CHECK(p.logit_bias[i].bias == want[i]);
        }
    }
    http_api_params_free(&p);
    CHECK_OK(parse("{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{}}", HTTP_API_COMPLETIONS,
                   &p, &err));
    CHECK(p.n_logit_bias == 0 && p.logit_bias == NULL);
    http_api_params_free(&p);
    {
        const char *lmsg = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
        char lbuf[512];
        const char *lb_bad[] = {
            "{\"1\":100.5}", "{\"1\":-101}", "{\"1\":\"5\"}", "{\"x\":1}", "{\"-1\":1}",
            "{\"1.5\":1}",   "{\"\":1}",     "{\" 1\":1}",     "{\"01\":1}", "{\"99999999999\":1}",
            "[1]",           "5",            "{\"1\":true}",   "{\"1\":null}",
        };
        for (size_t i = 0; i < sizeof(lb_bad) / sizeof(lb_bad[0]); i++) {
            snprintf(lbuf, sizeof(lbuf), "{\"model\":\"m\",%s,\"logit_bias\":%s}", lmsg, lb_bad[i]);
            expect_error(lbuf, HTTP_API_CHAT, "logit_bias");
        }
        /* 300 entries pass, 301 are refused */
        static char big[16384];
        for (int n = 300; n <= 301; n++) {
            size_t off = (size_t)snprintf(big, sizeof(big), "{\"model\":\"m\",%s,\"logit_bias\":{", lmsg);
            for (int t = 0; t < n; t++)
                off += (size_t)snprintf(big + off, sizeof(big) - off, "%s\"%d\":1", t ? "," : "", t);
            snprintf(big + off, sizeof(big) - off, "}}");
            if (n == 300) {
                CHECK_OK(parse(big, HTTP_API_CHAT, &p, &err));
                CHECK_EQ_INT(p.n_logit_bias, 300);
                http_api_params_free(&p);
            } else {
                expect_error(big, HTTP_API_CHAT, "logit_bias");
            }
        }
    }
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"messages\":[]}", HTTP_API_COMPLETIONS,
                 "messages");
    expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                 "\"echo\":true}",
                 HTTP_API_CHAT, "echo");
    /* wrong types and ranges */
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char buf[512];
    struct {
        const char *field, *param;
    } bad[] = {
        {"\"temperature\":\"hot\"", "temperature"}, {"\"temperature\":2.5", "temperature"},
        {"\"top_p\":0", "top_p"},                   {"\"top_p\":1.5", "top_p"},
        {"\"max_tokens\":0", "max_tokens"},         {"\"max_tokens\":1.5", "max_tokens"},
        {"\"n\":0", "n"},                           {"\"n\":17", "n"},
        {"\"presence_penalty\":3", "presence_penalty"},
        {"\"repetition_penalty\":0", "repetition_penalty"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop"},
        {"\"stop\":[\"\"]", "stop"},                {"\"stop\":5", "stop"},
        {"\"stream\":\"yes\"", "stream"},           {"\"seed\":\"1\"", "seed"},
        {"\"top_logprobs\":3", "top_logprobs"},     {"\"top_logprobs\":21", "top_logprobs"},
        {"\"stream_options\":{\"include_usage\":true}", "stream_options"},
        {"\"stream\":true,\"stream_options\":{\"x\":1}", "stream_options"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(buf, sizeof(buf), "{\"model\":\"m\",%s,%s}", msg, bad[i].field);
        expect_error(buf, HTTP_API_CHAT, bad[i].param);
    }
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", HTTP_API_CHAT, "model");
    expect_error("{\"model\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", HTTP_API_CHAT, "model");
    expect_error("{\"model\":\"m\",\"messages\":[]}", HTTP_API_CHAT, "messages");
    expect_error("{\"model\":\"m\"}", HTTP_API_CHAT, "messages");
    expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
                 HTTP_API_CHAT, "messages[0]");
    expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", HTTP_API_CHAT,
                 "messages[0]");
    expect_error("{\"model\":\"m\",\"prompt\":\"\"}", HTTP_API_COMPLETIONS, "prompt");
    expect_error("{\"model\":\"m\",\"prompt\":[]}", HTTP_API_COMPLETIONS, "prompt");
    expect_error("{\"model\":\"m\",\"prompt\":[1,-2]}", HTTP_API_COMPLETIONS, "prompt");
    expect_error("{\"model\":\"m\",\"prompt\":{}}", HTTP_API_COMPLETIONS, "prompt");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":6}", HTTP_API_COMPLETIONS,
                 "logprobs");
}

/* Pushes every token of `text` through a stream with the given stops and
 * returns the joined output (malloc'd); checks each delta is whole UTF-8. */
static char *run_stream(const tokenizer_t *tok, const char *text, const char **stops,
                        size_t n_stops, bool *stopped_out) {
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(tokenizer_encode_alloc(tok, text, strlen(text), 0, &ids, &n));
    size_t lens[4];
    for (size_t i = 0; i < n_stops; i++)
        lens[i] = strlen(stops[i]);
    stream_t *s = NULL;
    CHECK_OK(stream_init(tok, (char *const *)stops, lens, n_stops, &s));
    char *out = calloc(1, strlen(text) + 64);
    size_t off = 0;
    bool stopped = false;
    for (size_t i = 0; i < n && !stopped; i++) {
        const char *d;
        size_t len;
        CHECK_OK(stream_push(s, ids[i], &d, &len, &stopped));
        CHECK_EQ_INT(tokenizer_utf8_valid_prefix(d, len), len);
        memcpy(out + off, d, len);
        off += len;
    }
    const char *d;
    size_t len;
    CHECK_OK(stream_finish(s, &d, &len));
    memcpy(out + off, d, len);
    off += len;
    out[off] = 0;
    *stopped_out = stopped || stream_stopped(s);
    stream_free(s);
    free(ids);
    return out;
}

static void test_stream(const tokenizer_t *tok) {
    bool stopped;
    const char *text = "Hello world. The end is near, my friend.";
    char *out = run_stream(tok, text, NULL, 0, &stopped);
    CHECK(!strcmp(out, text) && !stopped);
    free(out);
    /* stop inside the text: everything before its first occurrence */
    const char *s1[] = {"end"};
    out = run_stream(tok, text, s1, 1, &stopped);
    CHECK_MSG(!strcmp(out, "Hello world. The ") && stopped, "got '%s'", out);
    free(out);
    /* a stop spanning a token boundary ("Hello" | " world") */
    const char *s2[] = {"lo wor"};
    out = run_stream(tok, text, s2, 1, &stopped);
    CHECK_MSG(!strcmp(out, "Hel") && stopped, "got '%s'", out);
    free(out);
    /* the earliest of several stops wins */
    const char *s3[] = {"near", "world", "zzz"};
    out = run_stream(tok, text, s3, 3, &stopped);
    CHECK_MSG(!strcmp(out, "Hello ") && stopped, "got '%s'", out);
    free(out);
    /* a partial match is held back and then released */
    const char *s4[] = {"world!", "friend!"};
    out = run_stream(tok, text, s4, 2, &stopped);
    CHECK_MSG(!strcmp(out, text) && !stopped, "got '%s'", out);
    free(out);
    /* multi-byte text: deltas stay whole characters (checked in run_stream) */
    const char *emoji = "Pizza \xF0\x9F\x8D\x95 and \xE4\xB8\xAD\xE6\x96\x87 text \xE2\x9D\xA4\xEF\xB8\x8F!";
    out = run_stream(tok, emoji, NULL, 0, &stopped);
    CHECK(!strcmp(out, emoji));
    free(out);
    const char *s5[] = {"\xE6\x96\x87"}; /* stop on the second CJK character */
    out = run_stream(tok, emoji, s5, 1, &stopped);
    CHECK_MSG(!strcmp(out, "Pizza \xF0\x9F\x8D\x95 and \xE4\xB8\xAD") && stopped, "got '%s'", out);
    free(out);
    /* bad id */
    stream_t *s = NULL;
    CHECK_OK(stream_init(tok, NULL, NULL, 0, &s));
    const char *d;
    size_t len;
    bool st;
    CHECK_EQ_INT(stream_push(s, tokenizer_n_vocab(tok), &d, &len, &st), BATON_ERR_OUT_OF_RANGE);
    stream_free(s);
    stream_free(NULL);
}

static proto_worker_register_t reg_of(const char *id, proto_role_t role, uint64_t seed) {
    proto_worker_register_t r;
    memset(&r, 0, sizeof(r));
    snprintf(r.worker_id, sizeof(r.worker_id), "%s", id);
    r.role = role;
    r.epoch = 1;
    r.zmq_endpoint = "tcp://127.0.0.1:1";
    r.vocab_size = 100;
    r.kv = (proto_kv_geometry_t){30, 3, 64, 16, PROTO_KV_DTYPE_F32, worker_table_seed_id(seed)};
    return r;
}

static void heartbeat(worker_table_t *t, const char *id, uint32_t free_blocks) {
    proto_worker_heartbeat_t hb;
    memset(&hb, 0, sizeof(hb));
    snprintf(hb.worker_id, sizeof(hb.worker_id), "%s", id);
    hb.epoch = 1;
    hb.free_blocks = free_blocks;
    hb.total_blocks = 1000;
    CHECK_OK(worker_table_heartbeat(t, &hb, 10));
}

static void test_workers_and_route(void) {
    static worker_table_t t;
    worker_table_init(&t, 16, 7, 100);
    char why[256];
    CHECK(!worker_table_ready(&t, why, sizeof(why)));
    uint32_t slot;
    bool ne;
    proto_worker_register_t r = reg_of("p0", PROTO_ROLE_PREFILL, 8);
    CHECK_EQ_INT(worker_table_register(&t, &r, NULL, 0, &slot, &ne), BATON_ERR_UNSUPPORTED);
    CHECK(strstr(baton_last_error(), "hash_seed_id") != NULL);
    r = reg_of("p0", PROTO_ROLE_PREFILL, 7);
    r.vocab_size = 99;
    CHECK_EQ_INT(worker_table_register(&t, &r, NULL, 0, &slot, &ne), BATON_ERR_UNSUPPORTED);
    r = reg_of("p0", PROTO_ROLE_PREFILL, 7);
    CHECK_OK(worker_table_register(&t, &r, "tcp://x:1", 0, &slot, &ne));
    uint32_t p0 = slot;
    r = reg_of("p1", PROTO_ROLE_PREFILL, 7);
    CHECK_OK(worker_table_register(&t, &r, NULL, 0, &slot, &ne));
    uint32_t p1 = slot;
    r = reg_of("d0", PROTO_ROLE_DECODE, 7);
    r.kv.n_layers = 31; /* wrong geometry: never paired */
    CHECK_OK(worker_table_register(&t, &r, NULL, 0, &slot, &ne));
    uint32_t d0 = slot;
    CHECK(!worker_table_ready(&t, why, sizeof(why)));
    CHECK_MSG(strstr(why, "n_layers") != NULL, "why: %s", why);
    uint32_t match[RADIX_INDEX_MAX_WORKERS] = {0};
    route_config_t cfg = {ROUTE_CACHE_AWARE, 1000, 2.0};
    route_state_t rs;
    route_state_init(&rs, &cfg);
    route_choice_t ch;
    CHECK_EQ_INT(route_pick(&rs, &t, match, 4, &ch), BATON_ERR_BUSY);
    /* re-register d0 with the right geometry: same epoch refreshes it */
    r = reg_of("d0", PROTO_ROLE_DECODE, 7);
    CHECK_OK(worker_table_register(&t, &r, NULL, 0, &slot, &ne));
    CHECK(slot == d0 && !ne);
    heartbeat(&t, "d0", 500);
    CHECK(worker_table_ready(&t, why, sizeof(why)));
    /* cache_aware: the worker holding more of the prefix */
    match[p1] = 10;
    match[p0] = 2;
    CHECK_OK(route_pick(&rs, &t, match, 12, &ch));
    CHECK(ch.prefill_slot == p1 && ch.decode_slot == d0 && ch.predicted_hit_blocks == 10);
    /* balance guard: p1 still scores best (400 * 16 - 5000 > 2 * 16) but its
     * load is over 1000 + 2 * 0 tokens */
    match[p1] = 400;
    t.w[p1].inflight_prefill_tokens = 5000;
    CHECK_OK(route_pick(&rs, &t, match, 12, &ch));
    CHECK(ch.prefill_slot == p0 && rs.balance_overrides == 1);
    /* moderate load: the prefix still wins (160 - 100 > 32 - 0) */
    match[p1] = 10;
    t.w[p1].inflight_prefill_tokens = 100;
    CHECK_OK(route_pick(&rs, &t, match, 12, &ch));
    CHECK(ch.prefill_slot == p1);
    /* no prefix anywhere and equal load: spread over both */
    memset(match, 0, sizeof(match));
    t.w[p1].inflight_prefill_tokens = 0;
    int seen[2] = {0, 0};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(route_pick(&rs, &t, match, 1, &ch));
        seen[ch.prefill_slot == p1]++;
    }
    CHECK(seen[0] == 2 && seen[1] == 2);
    /* round robin alternates regardless of prefix */
    cfg.policy = ROUTE_ROUND_ROBIN;
    route_state_init(&rs, &cfg);
    match[p1] = 10;
    uint32_t a, b;
    CHECK_OK(route_pick(&rs, &t, match, 1, &ch));
    a = ch.prefill_slot;
    CHECK_OK(route_pick(&rs, &t, match, 1, &ch));
    b = ch.prefill_slot;
    CHECK(a != b);
    /* least loaded */
    cfg.policy = ROUTE_LEAST_LOADED;
    route_state_init(&rs, &cfg);
    t.w[p0].inflight_prefill_tokens = 50;
    CHECK_OK(route_pick(&rs, &t, match, 1, &ch));
    CHECK(ch.prefill_slot == p1);
    /* colocated worker pairs only with itself */
    r = reg_of("c0", PROTO_ROLE_BOTH, 7);
    CHECK_OK(worker_table_register(&t, &r, NULL, 0, &slot, &ne));
    CHECK(worker_table_can_pair(&t.w[slot], &t.w[slot], why, sizeof(why)));
    CHECK(!worker_table_can_pair(&t.w[slot], &t.w[d0], why, sizeof(why)));
    /* expiry: heartbeats at t=10, registrations at t=0 */
    CHECK_EQ_INT(worker_table_next_expired(&t, 3000, 5000), -1);
    int e = worker_table_next_expired(&t, 6000, 5000);
    CHECK(e >= 0 && (uint32_t)e != d0); /* d0 heartbeated at 10 */
    /* new epoch */
    r = reg_of("p0", PROTO_ROLE_PREFILL, 7);
    r.epoch = 2;
    CHECK_OK(worker_table_register(&t, &r, NULL, 20, &slot, &ne));
    CHECK(slot == p0 && ne && t.w[p0].inflight_prefill_tokens == 0);
    proto_worker_heartbeat_t hb;
    memset(&hb, 0, sizeof(hb));
    snprintf(hb.worker_id, sizeof(hb.worker_id), "p0");
    hb.epoch = 1; /* stale epoch */
    CHECK_EQ_INT(worker_table_heartbeat(&t, &hb, 30), BATON_ERR_NOT_FOUND);
}

int main(void) {
    test_http_api();
    test_workers_and_route();
    const char *model = test_default_model();
    CHECK_MSG(model != NULL, "default model missing (scripts/fetch-model)");
    if (model) {
        gguf_file_t *f = NULL;
        tokenizer_t *tok = NULL;
        CHECK_OK(gguf_open(model, &f));
        CHECK_OK(tokenizer_load(f, &tok));
        gguf_close(f);
        if (tok)
            test_stream(tok);
        tokenizer_free(tok);
    }
    return TEST_DONE();
}
