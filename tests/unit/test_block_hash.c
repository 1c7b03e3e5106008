/* Block hash chain against golden vectors from python-xxhash
 * (tests/golden/gen_block_hash.py), chain properties, hex/bytes round trips,
 * and the block-hash map against a plain array model. */
#include <inttypes.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "tests/test_util.h"

/* Reads the golden file and checks every case; returns the number of cases. */
static int check_golden(void) {
    char path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/data/block_hash_golden.txt", src ? src : ".");
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return 0;
    int n_cases = 0;
    char word[64], name[128];
    while (fscanf(f, "%63s", word) == 1) {
        CHECK(strcmp(word, "case") == 0);
        unsigned long long seed = 0;
        char salt_hex[64];
        unsigned block_size = 0;
        size_t n_tokens = 0, n_hashes = 0;
        CHECK(fscanf(f, "%127s seed %llu salt %63s block_size %u tokens %zu", name, &seed,
                     salt_hex, &block_size, &n_tokens) == 5);
        int32_t *tokens = malloc((n_tokens + 1) * sizeof(*tokens));
        for (size_t i = 0; i < n_tokens; i++) {
            long v;
            CHECK(fscanf(f, "%ld", &v) == 1);
            tokens[i] = (int32_t)v;
        }
        CHECK(fscanf(f, " hashes %zu", &n_hashes) == 1);
        block_hash_t *want = malloc((n_hashes + 1) * sizeof(*want));
        for (size_t i = 0; i < n_hashes; i++) {
            char hex[64];
            CHECK(fscanf(f, "%63s", hex) == 1);
            CHECK_OK(block_hash_from_hex(hex, &want[i]));
        }
        CHECK(fscanf(f, "%63s", word) == 1 && strcmp(word, "end") == 0);
        block_hash_t salt;
        CHECK_OK(block_hash_from_hex(salt_hex, &salt));

        size_t count = 99;
        CHECK_OK(block_hash_chain(tokens, n_tokens, block_size, seed, &salt, NULL, 0, &count));
        CHECK_EQ_INT(count, n_hashes);
        block_hash_t *got = calloc(n_hashes + 1, sizeof(*got));
        size_t n_got = 0;
        CHECK_OK(block_hash_chain(tokens, n_tokens, block_size, seed, &salt, got, n_hashes + 1,
                                  &n_got));
        CHECK_EQ_INT(n_got, n_hashes);
        for (size_t i = 0; i < n_hashes && i < n_got; i++) {
            char a[33], b[33];
            block_hash_to_hex(&got[i], a);
            block_hash_to_hex(&want[i], b);
            CHECK_MSG(block_hash_eq(&got[i], &want[i]), "case %s block %zu: got %s want %s", name,
                      i, a, b);
        }
        /* block_hash_next reproduces the chain one block at a time. */
        block_hash_t prev = salt;
        for (size_t i = 0; i < n_hashes; i++) {
            block_hash_t h;
            CHECK_OK(block_hash_next(&prev, tokens + i * block_size, block_size, seed, &h));
            CHECK_MSG(block_hash_eq(&h, &want[i]), "case %s next %zu", name, i);
            prev = h;
        }
        free(got);
        free(want);
        free(tokens);
        n_cases++;
    }
    fclose(f);
    return n_cases;
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void check_properties(void) {
    enum { B = 16, NB = 8, N = B * NB };
    int32_t a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = b[i] = (int32_t)(rng() % 50000);
    block_hash_t ha[NB], hb[NB];
    size_t na, nb;
    const uint64_t seed = 0xC0FFEE;

    /* Same prefix -> same leading hashes; a change at token j changes every
     * hash from block j / B on and none before. */
    int j = 5 * B + 3;
    b[j] ^= 1;
    CHECK_OK(block_hash_chain(a, N, B, seed, NULL, ha, NB, &na));
    CHECK_OK(block_hash_chain(b, N, B, seed, NULL, hb, NB, &nb));
    CHECK_EQ_INT(na, NB);
    for (int i = 0; i < NB; i++) {
        if (i < j / B) CHECK_MSG(block_hash_eq(&ha[i], &hb[i]), "block %d should match", i);
        else CHECK_MSG(!block_hash_eq(&ha[i], &hb[i]), "block %d should differ", i);
    }
    /* A shorter sequence with the same prefix hashes the same full blocks. */
    block_hash_t hs[NB];
    size_t ns;
    CHECK_OK(block_hash_chain(a, 3 * B + 7, B, seed, NULL, hs, NB, &ns));
    CHECK_EQ_INT(ns, 3);
    for (int i = 0; i < 3; i++) CHECK(block_hash_eq(&hs[i], &ha[i]));

    /* Different seed or salt -> different hashes everywhere. */
    block_hash_t salt = {0x1234, 0x5678}, zero = {0, 0};
    CHECK_OK(block_hash_chain(a, N, B, seed + 1, NULL, hb, NB, &nb));
    for (int i = 0; i < NB; i++) CHECK(!block_hash_eq(&ha[i], &hb[i]));
    CHECK_OK(block_hash_chain(a, N, B, seed, &salt, hb, NB, &nb));
    for (int i = 0; i < NB; i++) CHECK(!block_hash_eq(&ha[i], &hb[i]));
    /* NULL salt == zero salt. */
    CHECK_OK(block_hash_chain(a, N, B, seed, &zero, hb, NB, &nb));
    for (int i = 0; i < NB; i++) CHECK(block_hash_eq(&ha[i], &hb[i]));
    /* Same tokens, different block size -> different first hash. */
    CHECK_OK(block_hash_chain(a, N, 2 * B, seed, NULL, hb, NB, &nb));
    CHECK_EQ_INT(nb, NB / 2);
    CHECK(!block_hash_eq(&ha[1], &hb[0]));

    /* Errors: outputs untouched. */
    size_t keep = 777;
    CHECK_EQ_INT(block_hash_chain(a, N, 0, seed, NULL, hb, NB, &keep), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(block_hash_chain(NULL, 5, B, seed, NULL, hb, NB, &keep), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(block_hash_chain(a, N, B, seed, NULL, hb, NB - 1, &keep), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(block_hash_chain(a, N, B, seed, NULL, NULL, NB, &keep), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(keep, 777);
    CHECK_EQ_INT(block_hash_chain(a, N, B, seed, NULL, hb, NB, NULL), BATON_ERR_INVALID_ARG);
    CHECK_OK(block_hash_chain(NULL, 0, B, seed, NULL, NULL, 0, &keep));
    CHECK_EQ_INT(keep, 0);
    block_hash_t h;
    CHECK_EQ_INT(block_hash_next(NULL, a, 0, seed, &h), BATON_ERR_INVALID_ARG);
}

static void check_codec(void) {
    block_hash_t h = {0x0123456789ABCDEFull, 0xFEDCBA9876543210ull}, back;
    uint8_t bytes[BLOCK_HASH_BYTES];
    block_hash_to_bytes(&h, bytes);
    CHECK_EQ_INT(bytes[0], 0x01);
    CHECK_EQ_INT(bytes[7], 0xEF);
    CHECK_EQ_INT(bytes[8], 0xFE);
    CHECK_EQ_INT(bytes[15], 0x10);
    back = block_hash_from_bytes(bytes);
    CHECK(block_hash_eq(&h, &back));
    char hex[33];
    block_hash_to_hex(&h, hex);
    CHECK(strcmp(hex, "0123456789abcdeffedcba9876543210") == 0);
    CHECK_OK(block_hash_from_hex("0123456789ABCDEFFEDCBA9876543210", &back));
    CHECK(block_hash_eq(&h, &back));
    block_hash_t untouched = {7, 7};
    CHECK_EQ_INT(block_hash_from_hex("0123", &untouched), BATON_ERR_FORMAT);
    CHECK_EQ_INT(block_hash_from_hex("0123456789abcdeffedcba98765432100", &untouched),
                 BATON_ERR_FORMAT);
    CHECK_EQ_INT(block_hash_from_hex("0123456789abcdeffedcba987654321g", &untouched),
                 BATON_ERR_FORMAT);
    CHECK(untouched.hi == 7 && untouched.lo == 7);
}

/* Map against an array model, with few distinct keys so that probe runs,
 * wrap-around and backward-shift deletion are all exercised. */
static void check_map(void) {
    enum { NK = 300, OPS = 200000 };
    block_hash_t keys[NK];
    uint32_t model[NK];
    bool present[NK];
    for (int i = 0; i < NK; i++) {
        keys[i].hi = rng();
        keys[i].lo = rng();
        present[i] = false;
    }
    /* Some keys that share the low half (same bucket unless hi mixes in). */
    for (int i = 0; i < 20; i++) keys[i].lo = 42;
    block_hash_map_t m;
    CHECK_OK(block_hash_map_init(&m, 0));
    size_t n = 0;
    for (int op = 0; op < OPS; op++) {
        int k = (int)(rng() % NK);
        uint64_t r = rng() % 3;
        if (r == 0) {
            uint32_t v = (uint32_t)rng();
            CHECK_OK(block_hash_map_put(&m, &keys[k], v));
            if (!present[k]) n++;
            present[k] = true;
            model[k] = v;
        } else if (r == 1) {
            uint32_t v = 0;
            bool got = block_hash_map_remove(&m, &keys[k], &v);
            CHECK_EQ_INT(got, present[k]);
            if (got) CHECK_EQ_INT(v, model[k]);
            if (present[k]) n--;
            present[k] = false;
        } else {
            uint32_t v = 0;
            bool got = block_hash_map_get(&m, &keys[k], &v);
            CHECK_EQ_INT(got, present[k]);
            if (got) CHECK_EQ_INT(v, model[k]);
        }
        CHECK_EQ_INT(block_hash_map_size(&m), n);
        if (op % 50000 == 49999) { /* full sweep */
            for (int i = 0; i < NK; i++) {
                uint32_t v = 0;
                CHECK_EQ_INT(block_hash_map_get(&m, &keys[i], &v), present[i]);
                if (present[i]) CHECK_EQ_INT(v, model[i]);
            }
        }
        if (t_failures > 20) break;
    }
    block_hash_map_clear(&m);
    CHECK_EQ_INT(block_hash_map_size(&m), 0);
    CHECK(!block_hash_map_get(&m, &keys[0], NULL));
    block_hash_map_free(&m);
    block_hash_map_free(&m); /* second free is a no-op */
    block_hash_map_free(NULL);
}

int main(void) {
    int n_cases = check_golden();
    CHECK_MSG(n_cases >= 10, "only %d golden cases read", n_cases);
    fprintf(stderr, "golden cases: %d\n", n_cases);
    check_properties();
    check_codec();
    check_map();
    return TEST_DONE();
}
