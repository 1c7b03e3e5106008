#!/usr/bin/env python3
"""Golden vectors for common/block_hash.c, computed independently with the
`xxhash` PyPI package (python-xxhash, bundling upstream xxHash).

Chain (DESIGN.md "KV cache", common/block_hash.h):
    h_{-1} = salt (16 bytes, XXH128 canonical = big-endian high64 || low64;
             all zero when the tenant's cache is shared)
    h_i    = XXH3_128bits_withSeed(h_{i-1} canonical || tokens of block i as
             little-endian int32, seed)
Only full blocks are hashed.

Usage: python tests/golden/gen_block_hash.py > tests/data/block_hash_golden.txt

Output, one case per block of lines:
    case <name>
    seed <u64 decimal>
    salt <32 hex digits, canonical>
    block_size <n>
    tokens <n> <t0> <t1> ...
    hashes <k> <32 hex canonical> ...
    end
"""
import random
import struct
import sys

import xxhash

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def chain(tokens, block_size, seed, salt):
    prev = salt
    out = []
    for b in range(len(tokens) // block_size):
        blk = tokens[b * block_size:(b + 1) * block_size]
        data = prev + struct.pack("<%di" % len(blk), *blk)
        prev = xxhash.xxh3_128_digest(data, seed=seed)
        out.append(prev)
    return out


def main():
    rng = random.Random(20261129)
    zero = bytes(16)
    cases = []
    cases.append(("empty", [], 16, 0, zero))
    cases.append(("partial_only", [1, 2, 3], 16, 0, zero))
    cases.append(("bs1", [rng.randrange(0, 49152) for _ in range(7)], 1, 1, zero))
    cases.append(("bs4_tail", [rng.randrange(0, 49152) for _ in range(19)], 4, 0xDEADBEEF, zero))
    cases.append(("bs16", [rng.randrange(0, 49152) for _ in range(16 * 9)], 16,
                  0x0123456789ABCDEF, zero))
    cases.append(("bs16_salted", [rng.randrange(0, 49152) for _ in range(16 * 5 + 7)], 16,
                  0x0123456789ABCDEF, bytes(range(1, 17))))
    cases.append(("bs16_seed_max", [rng.randrange(0, 128256) for _ in range(48)], 16,
                  2 ** 64 - 1, zero))
    cases.append(("edge_values", [0, -1, INT32_MIN, INT32_MAX, 1, 255, 256, 65536] * 4, 8,
                  42, bytes([0xFF] * 16)))
    cases.append(("bs32", [rng.randrange(0, 49152) for _ in range(32 * 6 + 31)], 32, 7, zero))
    # block of 4 KiB + 16 bytes: larger than the one-shot stack buffer in block_hash.c
    cases.append(("bs1024", [rng.randrange(0, 49152) for _ in range(1024 * 3 + 5)], 1024,
                  99, bytes(range(16, 32))))
    w = sys.stdout.write
    for name, toks, bs, seed, salt in cases:
        hs = chain(toks, bs, seed, salt)
        w("case %s\n" % name)
        w("seed %d\n" % seed)
        w("salt %s\n" % salt.hex())
        w("block_size %d\n" % bs)
        w("tokens %d%s\n" % (len(toks), "".join(" %d" % t for t in toks)))
        w("hashes %d%s\n" % (len(hs), "".join(" " + h.hex() for h in hs)))
        w("end\n")


if __name__ == "__main__":
    main()
