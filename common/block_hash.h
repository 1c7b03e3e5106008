/* Block hashes: chained 128-bit hashes over fixed-size token blocks, and an
 * open-addressing map keyed by them.
 *
 * DESIGN.md "KV cache" / "Global radix index": the hash of block i covers
 * every token from the start of the sequence to the end of block i, so one
 * hash names a whole prefix. Router and workers must agree on block size,
 * seed and salt (checked at registration).
 *
 *   h_{-1} = salt                       (128-bit tenant salt; zero = shared cache)
 *   h_i    = XXH3_128bits_withSeed(canon(h_{i-1}) || LE32(tokens of block i), seed)
 *
 * canon() is xxHash's XXH128 canonical form (XXH128_canonicalFromHash:
 * big-endian high64 then low64), the bytes python-xxhash's
 * xxh3_128_digest() returns; LE32 writes each token id as a little-endian
 * two's complement int32. Only FULL blocks are hashed; a trailing partial
 * block has no hash. The seed is the 64-bit cluster secret, so clients that
 * do not know it cannot craft colliding prefixes. Golden vectors:
 * tests/golden/gen_block_hash.py (independent, python-xxhash). */
#ifndef BATON_COMMON_BLOCK_HASH_H
#define BATON_COMMON_BLOCK_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define BLOCK_HASH_BYTES 16

/* One 128-bit block hash (XXH128_hash_t's two halves). */
typedef struct block_hash {
    uint64_t hi; /* high64 of XXH128_hash_t */
    uint64_t lo; /* low64 of XXH128_hash_t */
} block_hash_t;

/* A cached block's hash with its parent (the hash of the block before it in
 * the chain). has_parent is false for block 0 (its parent is the salt, which
 * is not a block). Used by KV events, snapshots and the router's index. */
typedef struct block_hash_link {
    block_hash_t hash;
    block_hash_t parent; /* meaningful only when has_parent */
    bool has_parent;
} block_hash_link_t;

static inline bool block_hash_eq(const block_hash_t *a, const block_hash_t *b) {
    return a->hi == b->hi && a->lo == b->lo;
}

/* Writes the canonical 16 bytes of `h` (big-endian hi, then lo) to `out`;
 * the form hashed into the chain and carried on the wire. */
void block_hash_to_bytes(const block_hash_t *h, uint8_t out[BLOCK_HASH_BYTES]);

/* Reads a hash from its canonical 16 bytes. */
block_hash_t block_hash_from_bytes(const uint8_t in[BLOCK_HASH_BYTES]);

/* Writes the 32 lowercase hex digits of the canonical bytes and a NUL to
 * `out` (33 bytes). */
void block_hash_to_hex(const block_hash_t *h, char out[2 * BLOCK_HASH_BYTES + 1]);

/* Parses exactly 32 hex digits (either case) into *out.
 * Errors: BATON_ERR_FORMAT (wrong length or a non-hex digit; *out untouched). */
baton_status_t block_hash_from_hex(const char *hex, block_hash_t *out);

/* Hash of one block given the hash of the block before it (`prev`; the salt
 * for block 0, NULL = zero salt): `block_size` tokens at `tokens`.
 * Errors: BATON_ERR_INVALID_ARG (block_size 0, tokens NULL). */
baton_status_t block_hash_next(const block_hash_t *prev, const int32_t *tokens,
                               uint32_t block_size, uint64_t seed, block_hash_t *out);

/* Chain hashes of every full block of tokens[0..n_tokens): writes
 * floor(n_tokens / block_size) hashes to out[0..] and their count to *n_out.
 * `salt` NULL means the zero salt (shared cache). Passing out == NULL and
 * cap == 0 only reports the count in *n_out.
 * Errors: BATON_ERR_INVALID_ARG (block_size 0, tokens NULL with n_tokens > 0,
 * n_out NULL), BATON_ERR_OUT_OF_RANGE (cap smaller than the number of full
 * blocks; nothing written). */
baton_status_t block_hash_chain(const int32_t *tokens, size_t n_tokens, uint32_t block_size,
                                uint64_t seed, const block_hash_t *salt, block_hash_t *out,
                                size_t cap, size_t *n_out);

/* Open-addressing (linear probing, backward-shift deletion) map from a block
 * hash to a uint32 value. Buckets come from the hash's own low bits: block
 * hashes are seeded XXH3 outputs, uniform and not chosen by clients. Grows
 * at 1/2 load; never shrinks. Not thread-safe. Fields are private; the
 * struct is public only so that owners can embed it. */
typedef struct block_hash_map_slot {
    block_hash_t key;
    uint32_t value;
    uint32_t used; /* 1 when the slot holds a key */
} block_hash_map_slot_t;

typedef struct block_hash_map {
    block_hash_map_slot_t *slots; /* [cap], cap a power of two */
    size_t cap;
    size_t size;
} block_hash_map_t;

/* Initialises an empty map with room for about `expected` keys before it
 * first grows. Errors: BATON_ERR_NO_MEMORY. */
baton_status_t block_hash_map_init(block_hash_map_t *map, size_t expected);

/* Frees the slots; NULL-safe; the map may be initialised again. */
void block_hash_map_free(block_hash_map_t *map);

/* Looks `key` up; on a hit writes its value to *value_out (may be NULL) and
 * returns true. */
bool block_hash_map_get(const block_hash_map_t *map, const block_hash_t *key,
                        uint32_t *value_out);

/* Inserts `key` -> `value`, replacing the value if the key exists.
 * Errors: BATON_ERR_NO_MEMORY (growth failed; the map is unchanged). */
baton_status_t block_hash_map_put(block_hash_map_t *map, const block_hash_t *key, uint32_t value);

/* Removes `key`; returns true (and its value in *value_out, may be NULL) when
 * it was present. */
bool block_hash_map_remove(block_hash_map_t *map, const block_hash_t *key, uint32_t *value_out);

/* Removes every key, keeping the capacity. */
void block_hash_map_clear(block_hash_map_t *map);

static inline size_t block_hash_map_size(const block_hash_map_t *map) { return map->size; }

#endif
