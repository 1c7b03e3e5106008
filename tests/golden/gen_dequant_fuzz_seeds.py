#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/fuzz_gguf.c with the `gguf` Python
package's own writer (gguf.GGUFWriter), so the seeds are valid GGUF files
made by an implementation other than ours.

    .venv/bin/python tests/golden/gen_dequant_fuzz_seeds.py
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus_gguf")
rng = np.random.default_rng(7)


def raw_tensor(w, name, qtype, shape):
    """shape in ggml order (ne[0] first); random bytes for quantized types."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    n_rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    row_bytes = shape[0] // bs * ts
    data = rng.integers(0, 256, size=(n_rows, row_bytes), dtype=np.uint8)
    w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)  # byte shape


def write(name, fill, alignment=None):
    path = os.path.join(OUT, name)
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(path, os.path.getsize(path))


def kvs_and_floats(w):
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_string("general.name", "seed")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab", ""])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 1, 3])
    w.add_array("x.f32s", [0.5, -1.0])
    w.add_int64("x.i64", -5)
    w.add_uint8("x.u8", 3)
    w.add_float64("x.f64", 2.5)
    w.add_tensor("f32", rng.standard_normal((2, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((8,)).astype(np.float16))
    raw_tensor(w, "bf16", Q.BF16, [4, 2])


def quants(w):
    w.add_uint32("general.file_type", 3)
    for qt in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
        raw_tensor(w, "t." + qt.name.lower(), qt, [32, 2])
    for qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        raw_tensor(w, "t." + qt.name.lower(), qt, [256])
    raw_tensor(w, "t.q5_0", Q.Q5_0, [32])


def main():
    os.makedirs(OUT, exist_ok=True)
    write("seed_kvs_floats.gguf", kvs_and_floats)
    write("seed_quants.gguf", quants)
    write("seed_align64.gguf", kvs_and_floats, alignment=64)


if __name__ == "__main__":
    main()
