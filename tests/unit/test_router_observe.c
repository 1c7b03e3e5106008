/* router/observe: stage decomposition, record JSON, ring, tenant names and
 * sums, utilisation window, fingerprint (issue 6). Expected values are
 * worked out by hand from the definitions in router/observe.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "router/observe.h"
#include "tests/test_util.h"

static int near(double a, double b) { return fabs(a - b) < 1e-9; }

static void test_stages(void) {
    double st[OBSERVE_N_STAGES], e2e;
    /* disaggregated: arrival 1000, PrefillDone copy at 51000, end 91000;
     * worker: prefill 30 ms, transfer 5 ms -> queue = 50 - 30 - 5 = 15 ms,
     * decode = 91000 - 51000 = 40 ms */
    observe_times_t t = {.arrival_us = 1000, .prefill_done_us = 51000, .end_us = 91000,
                         .prefill_us = 30000, .transfer_us = 5000, .decode_us = 12345};
    observe_stages(&t, st, &e2e);
    CHECK(near(e2e, 90.0));
    CHECK(near(st[0], 15.0) && near(st[1], 30.0) && near(st[2], 5.0) && near(st[3], 40.0));
    /* worker times exceeding what the router saw are clamped: prefill 60 ms
     * in a 50 ms window -> prefill 50, transfer 0, queue 0 */
    t.prefill_us = 60000;
    observe_stages(&t, st, &e2e);
    CHECK(near(st[0], 0.0) && near(st[1], 50.0) && near(st[2], 0.0) && near(st[3], 40.0));
    CHECK(near(st[0] + st[1] + st[2] + st[3], e2e));
    /* colocated (no PrefillDone copy): decode = the worker's decode_us */
    t = (observe_times_t){.arrival_us = 0, .prefill_done_us = 0, .end_us = 100000,
                          .prefill_us = 20000, .transfer_us = 0, .decode_us = 70000};
    observe_stages(&t, st, &e2e);
    CHECK(near(e2e, 100.0) && near(st[3], 70.0) && near(st[1], 20.0) && near(st[0], 10.0) &&
          near(st[2], 0.0));
    /* decode_us longer than e2e: everything is decode */
    t.decode_us = 200000;
    observe_stages(&t, st, &e2e);
    CHECK(near(st[3], 100.0) && near(st[0] + st[1] + st[2], 0.0));
    /* PrefillDone "after" the end (reordered instants): clamped to the end */
    t = (observe_times_t){.arrival_us = 10, .prefill_done_us = 500, .end_us = 400};
    observe_stages(&t, st, &e2e);
    CHECK(near(e2e, 0.39) && near(st[3], 0.0) && near(st[0], 0.39));
}

static void test_record_json(void) {
    observe_record_t r;
    memset(&r, 0, sizeof(r));
    snprintf(r.request_id, sizeof(r.request_id), "cmpl-abc");
    snprintf(r.tenant, sizeof(r.tenant), "t1");
    snprintf(r.finish_reason, sizeof(r.finish_reason), "length");
    r.complete = true;
    r.e2e_ms = 90.0;
    r.stages_ms[0] = 15.0, r.stages_ms[1] = 30.0, r.stages_ms[2] = 5.0, r.stages_ms[3] = 40.0;
    r.prefill_device_us = 71000;
    r.decode_device_us = 13000;
    r.prompt_tokens = 2048, r.predicted_hit_tokens = 1024, r.cached_tokens = 1008;
    json_t *j = observe_record_json(&r);
    CHECK(j != NULL);
    if (!j) return;
    CHECK(!strcmp(json_string_value(json_object_get(j, "request_id")), "cmpl-abc"));
    CHECK(json_is_true(json_object_get(j, "complete")));
    json_t *st = json_object_get(j, "stages_ms");
    CHECK(near(json_real_value(json_object_get(st, "transfer")), 5.0));
    json_t *dv = json_object_get(j, "device_seconds");
    CHECK(near(json_real_value(json_object_get(dv, "prefill")), 0.071));
    CHECK(near(json_real_value(json_object_get(dv, "decode")), 0.013));
    json_t *pc = json_object_get(j, "prefix_cache");
    CHECK_EQ_INT(json_integer_value(json_object_get(pc, "predicted_hit_tokens")), 1024);
    CHECK_EQ_INT(json_integer_value(json_object_get(pc, "cached_tokens")), 1008);
    json_decref(j);
    char *line = observe_record_line(&r);
    CHECK(line && !strchr(line, '\n') && strstr(line, "\"e2e_ms\":90"));
    free(line);
}

static void test_ring(void) {
    observe_ring_t ring;
    CHECK(observe_ring_init(&ring, 0) == BATON_ERR_INVALID_ARG);
    CHECK_OK(observe_ring_init(&ring, 3));
    observe_record_t r;
    memset(&r, 0, sizeof(r));
    for (int i = 0; i < 5; i++) { /* ids r0..r4; capacity 3 keeps r2..r4 */
        snprintf(r.request_id, sizeof(r.request_id), "r%d", i);
        r.e2e_ms = i;
        observe_ring_push(&ring, &r);
    }
    CHECK(observe_ring_find(&ring, "r0", 0) == NULL && observe_ring_find(&ring, "r1", 0) == NULL);
    for (int i = 2; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof(id), "r%d", i);
        observe_record_t *f = observe_ring_find(&ring, id, 0);
        CHECK(f && near(f->e2e_ms, i));
    }
    CHECK(observe_ring_find(&ring, "r4", 1) == NULL); /* another choice */
    r.choice = 1;
    r.e2e_ms = 99;
    observe_ring_push(&ring, &r); /* r4 choice 1 evicts r2 */
    CHECK(observe_ring_find(&ring, "r2", 0) == NULL);
    CHECK(near(observe_ring_find(&ring, "r4", 1)->e2e_ms, 99) &&
          near(observe_ring_find(&ring, "r4", 0)->e2e_ms, 4));
    observe_ring_free(&ring);
    observe_ring_free(NULL);
}

static void test_tenants(void) {
    char n[OBSERVE_TENANT_MAX + 1];
    observe_tenant_name(NULL, NULL, n);
    CHECK(!strcmp(n, "default"));
    observe_tenant_name(NULL, "", n);
    CHECK(!strcmp(n, "default"));
    observe_tenant_name(NULL, "alice@example.com", n);
    CHECK(!strcmp(n, "alice@example.com"));
    observe_tenant_name(NULL, "a\"b\\c\nd{e} f", n); /* label-breaking bytes */
    CHECK(!strcmp(n, "a_b_c_d_e__f"));
    char longname[200];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[199] = 0;
    observe_tenant_name(NULL, longname, n);
    CHECK_EQ_INT(strlen(n), OBSERVE_TENANT_MAX);
    /* an API key never appears: "key-" + 12 hex of XXH3-64 >> 16 */
    observe_tenant_name("sk-secret", "bob", n);
    char want[32];
    snprintf(want, sizeof(want), "key-%012llx",
             (unsigned long long)(XXH3_64bits("sk-secret", 9) >> 16));
    CHECK(!strcmp(n, want) && !strstr(n, "secret"));

    observe_tenants_t t;
    memset(&t, 0, sizeof(t));
    CHECK_OK(observe_tenants_add(&t, "a", 1500000, 10, 4, 1));
    CHECK_OK(observe_tenants_add(&t, "b", 1, 1, 1, 1));
    CHECK_OK(observe_tenants_add(&t, "a", 500000, 5, 2, 1));
    CHECK_EQ_INT(t.n, 2);
    metrics_text_t txt;
    memset(&txt, 0, sizeof(txt));
    observe_tenants_write(&txt, &t);
    CHECK(txt.buf && strstr(txt.buf, "baton_router_tenant_device_seconds_total{tenant=\"a\"} 2.000000\n"));
    CHECK(strstr(txt.buf, "baton_router_tenant_prompt_tokens_total{tenant=\"a\"} 15\n"));
    CHECK(strstr(txt.buf, "baton_router_tenant_completion_tokens_total{tenant=\"a\"} 6\n"));
    CHECK(strstr(txt.buf, "baton_router_tenant_requests_total{tenant=\"a\"} 2\n"));
    CHECK(strstr(txt.buf, "baton_router_tenant_requests_total{tenant=\"b\"} 1\n"));
    metrics_text_free(&txt);
    /* beyond OBSERVE_MAX_TENANTS names the sums go to "other" */
    for (int i = 0; i < OBSERVE_MAX_TENANTS + 10; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t%d", i);
        CHECK_OK(observe_tenants_add(&t, name, 0, 0, 0, 1));
    }
    CHECK(t.n <= OBSERVE_MAX_TENANTS + 1);
    uint64_t other = 0;
    for (size_t i = 0; i < t.n; i++)
        if (!strcmp(t.items[i].name, "other")) other = t.items[i].requests;
    /* 2 existing + 1022 new fill 1024; the remaining 12 + ... land in "other" */
    CHECK_EQ_INT(other, OBSERVE_MAX_TENANTS + 10 - (OBSERVE_MAX_TENANTS - 2));
    observe_tenants_free(&t);
    observe_tenants_free(NULL);
}

static void test_util(void) {
    observe_util_t u;
    memset(&u, 0, sizeof(u));
    double f;
    CHECK(!observe_util_fraction(&u, 0, &f));
    /* heartbeats every 500 ms, 200 ms busy each: 0.4 */
    for (int i = 0; i <= 10; i++) observe_util_add(&u, 1, 1000 + 500u * i, 200000u * i);
    CHECK(observe_util_fraction(&u, 6000, &f) && near(f, 0.4));
    /* only the last minute counts: 200 s idle (no busy growth), then busy at 100 % */
    for (int i = 1; i <= 400; i++) observe_util_add(&u, 1, 6000 + 500u * i, 2000000);
    for (int i = 1; i <= 10; i++) observe_util_add(&u, 1, 206000 + 500u * i, 2000000 + 500000u * i);
    /* window [151000, 211000]: 5000 ms of 100 % in 60000 ms -> 1/12 */
    CHECK(observe_util_fraction(&u, 211000, &f) && fabs(f - 5000.0 / 60000.0) < 1e-3);
    /* a restart (new epoch) forgets the old samples */
    observe_util_add(&u, 2, 212000, 10);
    CHECK(!observe_util_fraction(&u, 212000, &f));
}

static void test_fingerprint(void) {
    json_t *a = json_pack("{s:s, s:i, s:[s]}", "policy", "cache_aware", "block_size", 16,
                          "x", "y");
    json_t *b = json_pack("{s:[s], s:i, s:s}", "x", "y", "block_size", 16, "policy",
                          "cache_aware"); /* same content, other key order */
    json_t *c = json_pack("{s:s, s:i, s:[s]}", "policy", "round_robin", "block_size", 16,
                          "x", "y");
    char fa[16], fb[16], fc[16];
    observe_fingerprint(a, fa);
    observe_fingerprint(b, fb);
    observe_fingerprint(c, fc);
    CHECK(strlen(fa) == 13 && !strncmp(fa, "fp_", 3));
    CHECK(!strcmp(fa, fb) && strcmp(fa, fc) != 0);
    /* by definition: XXH3-64 of the sorted compact dump, first 10 hex digits */
    char *s = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
    char want[16];
    snprintf(want, sizeof(want), "fp_%010llx",
             (unsigned long long)(XXH3_64bits(s, strlen(s)) >> 24));
    CHECK(!strcmp(fa, want));
    free(s);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

int main(void) {
    test_stages();
    test_record_json();
    test_ring();
    test_tenants();
    test_util();
    test_fingerprint();
    return TEST_DONE();
}
