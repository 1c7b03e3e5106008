/* Chained XXH3-128 block hashes and the block-hash map (see block_hash.h). */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include "common/block_hash.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Blocks up to this many tokens are hashed in one XXH3 call from a stack
 * buffer; larger ones go through the streaming API in chunks of this size. */
#define BLOCK_HASH_ONESHOT_TOKENS 512

void block_hash_to_bytes(const block_hash_t *h, uint8_t out[BLOCK_HASH_BYTES]) {
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(h->hi >> (56 - 8 * i));
        out[8 + i] = (uint8_t)(h->lo >> (56 - 8 * i));
    }
}

block_hash_t block_hash_from_bytes(const uint8_t in[BLOCK_HASH_BYTES]) {
    block_hash_t h = {0, 0};
    for (int i = 0; i < 8; i++) {
        h.hi = (h.hi << 8) | in[i];
        h.lo = (h.lo << 8) | in[8 + i];
    }
    return h;
}

void block_hash_to_hex(const block_hash_t *h, char out[2 * BLOCK_HASH_BYTES + 1]) {
    static const char digits[] = "0123456789abcdef";
    uint8_t b[BLOCK_HASH_BYTES];
    block_hash_to_bytes(h, b);
    for (int i = 0; i < BLOCK_HASH_BYTES; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * BLOCK_HASH_BYTES] = '\0';
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

baton_status_t block_hash_from_hex(const char *hex, block_hash_t *out) {
    if (!hex || !out) return baton_error(BATON_ERR_INVALID_ARG, "block_hash_from_hex: NULL argument");
    uint8_t b[BLOCK_HASH_BYTES];
    for (int i = 0; i < BLOCK_HASH_BYTES; i++) {
        int a = hex_val(hex[2 * i]);
        if (a < 0) return baton_error(BATON_ERR_FORMAT, "block hash: bad hex digit at %d", 2 * i);
        int c = hex_val(hex[2 * i + 1]);
        if (c < 0) return baton_error(BATON_ERR_FORMAT, "block hash: bad hex digit at %d", 2 * i + 1);
        b[i] = (uint8_t)(a << 4 | c);
    }
    if (hex[2 * BLOCK_HASH_BYTES] != '\0')
        return baton_error(BATON_ERR_FORMAT, "block hash: more than %d hex digits",
                           2 * BLOCK_HASH_BYTES);
    *out = block_hash_from_bytes(b);
    return BATON_OK;
}

/* Writes n tokens as little-endian int32 (two's complement) to dst. */
static void put_tokens_le(uint8_t *dst, const int32_t *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)tokens[i];
        dst[4 * i] = (uint8_t)u;
        dst[4 * i + 1] = (uint8_t)(u >> 8);
        dst[4 * i + 2] = (uint8_t)(u >> 16);
        dst[4 * i + 3] = (uint8_t)(u >> 24);
    }
}

/* The chain step with arguments already checked. */
static void hash_step(const block_hash_t *prev, const int32_t *tokens, uint32_t block_size,
                      uint64_t seed, block_hash_t *out) {
    uint8_t buf[BLOCK_HASH_BYTES + 4 * BLOCK_HASH_ONESHOT_TOKENS];
    XXH128_hash_t h;
    block_hash_to_bytes(prev, buf);
    if (block_size <= BLOCK_HASH_ONESHOT_TOKENS) {
        put_tokens_le(buf + BLOCK_HASH_BYTES, tokens, block_size);
        h = XXH3_128bits_withSeed(buf, BLOCK_HASH_BYTES + 4 * (size_t)block_size, seed);
    } else {
        XXH3_state_t state;
        XXH3_INITSTATE(&state);
        XXH3_128bits_reset_withSeed(&state, seed);
        XXH3_128bits_update(&state, buf, BLOCK_HASH_BYTES);
        for (uint32_t done = 0; done < block_size;) {
            uint32_t k = block_size - done;
            if (k > BLOCK_HASH_ONESHOT_TOKENS) k = BLOCK_HASH_ONESHOT_TOKENS;
            put_tokens_le(buf, tokens + done, k);
            XXH3_128bits_update(&state, buf, 4 * (size_t)k);
            done += k;
        }
        h = XXH3_128bits_digest(&state);
    }
    out->hi = h.high64;
    out->lo = h.low64;
}

baton_status_t block_hash_next(const block_hash_t *prev, const int32_t *tokens,
                               uint32_t block_size, uint64_t seed, block_hash_t *out) {
    if (block_size == 0) return baton_error(BATON_ERR_INVALID_ARG, "block hash: block_size is 0");
    if (!tokens || !out) return baton_error(BATON_ERR_INVALID_ARG, "block_hash_next: NULL argument");
    static const block_hash_t zero = {0, 0};
    hash_step(prev ? prev : &zero, tokens, block_size, seed, out);
    return BATON_OK;
}

baton_status_t block_hash_chain(const int32_t *tokens, size_t n_tokens, uint32_t block_size,
                                uint64_t seed, const block_hash_t *salt, block_hash_t *out,
                                size_t cap, size_t *n_out) {
    if (block_size == 0) return baton_error(BATON_ERR_INVALID_ARG, "block hash: block_size is 0");
    if (!n_out) return baton_error(BATON_ERR_INVALID_ARG, "block_hash_chain: n_out is NULL");
    if (!tokens && n_tokens > 0)
        return baton_error(BATON_ERR_INVALID_ARG, "block_hash_chain: tokens NULL with n_tokens %zu",
                           n_tokens);
    size_t n_blocks = n_tokens / block_size;
    if (!out && cap == 0) {
        *n_out = n_blocks;
        return BATON_OK;
    }
    if (!out || cap < n_blocks)
        return baton_error(BATON_ERR_OUT_OF_RANGE,
                           "block_hash_chain: room for %zu hashes, %zu full blocks", cap, n_blocks);
    block_hash_t prev = salt ? *salt : (block_hash_t){0, 0};
    for (size_t b = 0; b < n_blocks; b++) {
        hash_step(&prev, tokens + b * block_size, block_size, seed, &out[b]);
        prev = out[b];
    }
    *n_out = n_blocks;
    return BATON_OK;
}

/* ---- map ---------------------------------------------------------------- */

static size_t map_bucket(const block_hash_map_t *map, const block_hash_t *key) {
    /* Mix both halves so that a hash with a weak low half still spreads. */
    uint64_t x = key->lo ^ (key->hi * 0x9E3779B97F4A7C15ull);
    return (size_t)(x ^ (x >> 29)) & (map->cap - 1);
}

baton_status_t block_hash_map_init(block_hash_map_t *map, size_t expected) {
    if (!map) return baton_error(BATON_ERR_INVALID_ARG, "block_hash_map_init: map is NULL");
    size_t cap = 16;
    while (cap < 2 * expected && cap < ((size_t)1 << 40)) cap <<= 1;
    block_hash_map_slot_t *slots = calloc(cap, sizeof(*slots));
    if (!slots) return baton_error(BATON_ERR_NO_MEMORY, "block hash map: %zu slots", cap);
    map->slots = slots;
    map->cap = cap;
    map->size = 0;
    return BATON_OK;
}

void block_hash_map_free(block_hash_map_t *map) {
    if (!map) return;
    free(map->slots);
    map->slots = NULL;
    map->cap = 0;
    map->size = 0;
}

static size_t map_find(const block_hash_map_t *map, const block_hash_t *key, bool *found) {
    size_t i = map_bucket(map, key);
    while (map->slots[i].used) {
        if (block_hash_eq(&map->slots[i].key, key)) {
            *found = true;
            return i;
        }
        i = (i + 1) & (map->cap - 1);
    }
    *found = false;
    return i;
}

bool block_hash_map_get(const block_hash_map_t *map, const block_hash_t *key,
                        uint32_t *value_out) {
    if (!map || !map->slots || !key) return false;
    bool found;
    size_t i = map_find(map, key, &found);
    if (found && value_out) *value_out = map->slots[i].value;
    return found;
}

static baton_status_t map_grow(block_hash_map_t *map) {
    size_t cap = map->cap * 2;
    block_hash_map_slot_t *slots = calloc(cap, sizeof(*slots));
    if (!slots) return baton_error(BATON_ERR_NO_MEMORY, "block hash map: grow to %zu slots", cap);
    block_hash_map_t grown = {slots, cap, 0};
    for (size_t i = 0; i < map->cap; i++) {
        if (!map->slots[i].used) continue;
        bool found;
        size_t j = map_find(&grown, &map->slots[i].key, &found);
        grown.slots[j] = map->slots[i];
        grown.size++;
    }
    free(map->slots);
    *map = grown;
    return BATON_OK;
}

baton_status_t block_hash_map_put(block_hash_map_t *map, const block_hash_t *key, uint32_t value) {
    if (!map || !map->slots || !key)
        return baton_error(BATON_ERR_INVALID_ARG, "block_hash_map_put: NULL argument");
    bool found;
    size_t i = map_find(map, key, &found);
    if (found) {
        map->slots[i].value = value;
        return BATON_OK;
    }
    if (2 * (map->size + 1) > map->cap) {
        baton_status_t st = map_grow(map);
        if (st != BATON_OK) return st;
        i = map_find(map, key, &found);
    }
    map->slots[i].key = *key;
    map->slots[i].value = value;
    map->slots[i].used = 1;
    map->size++;
    return BATON_OK;
}

bool block_hash_map_remove(block_hash_map_t *map, const block_hash_t *key, uint32_t *value_out) {
    if (!map || !map->slots || !key) return false;
    bool found;
    size_t i = map_find(map, key, &found);
    if (!found) return false;
    if (value_out) *value_out = map->slots[i].value;
    /* Backward-shift deletion (Knuth 6.4, Algorithm R): move later members of
     * the probe run into the hole when their home bucket allows it. */
    size_t mask = map->cap - 1;
    size_t hole = i;
    for (size_t j = (i + 1) & mask; map->slots[j].used; j = (j + 1) & mask) {
        size_t home = map_bucket(map, &map->slots[j].key);
        /* j may move to hole iff home is not cyclically in (hole, j]. */
        bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            map->slots[hole] = map->slots[j];
            hole = j;
        }
    }
    memset(&map->slots[hole], 0, sizeof(map->slots[hole]));
    map->size--;
    return true;
}

void block_hash_map_clear(block_hash_map_t *map) {
    if (!map || !map->slots) return;
    memset(map->slots, 0, map->cap * sizeof(*map->slots));
    map->size = 0;
}
