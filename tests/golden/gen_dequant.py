#!/usr/bin/env python3
"""Generates the golden files of the GGUF loader and dequantization tests.

The reference is the `gguf` Python package (gguf.GGUFReader for metadata and
tensor offsets, gguf.quants.dequantize for the block formats), an
implementation independent of common/gguf.c and common/dequant.c.

    .venv/bin/python tests/golden/gen_dequant.py [model.gguf]

Writes (all little-endian):
  tests/data/dequant_model_meta.txt  header values, selected kvs and every
                                     tensor's name/type/shape/offset
  tests/data/dequant_model.bin       "BDQM", u32 count, then per record:
                                     u32 name_len, name, u32 type, u32 row0,
                                     u32 n_rows, u32 row_elems,
                                     f32[n_rows * row_elems]
  tests/data/dequant_blocks.bin      "BDQB", u32 count, then per record:
                                     u32 type, u32 n_elems, u32 n_bytes,
                                     u8[n_bytes], f32[n_elems]
"""
import importlib.metadata
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf")

rng = np.random.default_rng(20261129)


def field_value(f):
    return f.contents()


def write_meta(r):
    lines = []
    lines.append("version %d" % field_value(r.fields["GGUF.version"]))
    lines.append("n_tensors %d" % field_value(r.fields["GGUF.tensor_count"]))
    lines.append("n_kv %d" % field_value(r.fields["GGUF.kv_count"]))
    lines.append("alignment %d" % r.alignment)
    lines.append("data_offset %d" % r.data_offset)
    for key in ["llama.block_count", "llama.context_length", "llama.embedding_length",
                "llama.feed_forward_length", "llama.attention.head_count",
                "llama.attention.head_count_kv", "llama.vocab_size",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "general.file_type"]:
        lines.append("u32 %s %d" % (key, field_value(r.fields[key])))
    for key in ["llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"]:
        # float32 bit pattern, exact
        bits = struct.unpack("<I", struct.pack("<f", field_value(r.fields[key])))[0]
        lines.append("f32 %s %08x" % (key, bits))
    for key in ["tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"]:
        lines.append("bool %s %d" % (key, int(field_value(r.fields[key]))))
    for key in ["general.architecture", "general.name", "tokenizer.ggml.model",
                "tokenizer.ggml.pre", "tokenizer.chat_template"]:
        lines.append("str %s %s" % (key, field_value(r.fields[key]).encode().hex()))
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    for i in [0, 1, 2, 100, 1000, 49151]:
        lines.append("strarr tokenizer.ggml.tokens %d %d %s" % (len(toks), i, toks[i].encode().hex()))
    merges = r.fields["tokenizer.ggml.merges"].contents()
    for i in [0, 48899]:
        lines.append("strarr tokenizer.ggml.merges %d %d %s" % (len(merges), i, merges[i].encode().hex()))
    tt = r.fields["tokenizer.ggml.token_type"].contents()
    for i in [0, 1, 2, 17, 49151]:
        lines.append("i32arr tokenizer.ggml.token_type %d %d %d" % (len(tt), i, tt[i]))
    for t in r.tensors:
        ne = list(int(x) for x in t.shape) + [1] * (4 - len(t.shape))
        lines.append("tensor %s %d %d %d %d %d %d %d %d" % (
            t.name, int(t.tensor_type), len(t.shape), ne[0], ne[1], ne[2], ne[3],
            t.data_offset - r.data_offset, t.n_bytes))
    with open(os.path.join(DATA, "dequant_model_meta.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


def write_model_slices(r):
    """A few rows of one tensor of each type the model holds."""
    raw = np.memmap(MODEL, dtype=np.uint8, mode="r")
    picks = {}
    for t in r.tensors:
        picks.setdefault(int(t.tensor_type), []).append(t)
    recs = []
    for ttype, ts in sorted(picks.items()):
        for t in [ts[0], ts[-1]]:
            row_elems = int(t.shape[0])
            n_rows_total = int(np.prod(t.shape)) // row_elems
            bs, tsz = gguf.GGML_QUANT_SIZES[Q(ttype)]
            row_bytes = row_elems // bs * tsz
            for row0, n_rows in [(0, 2), (n_rows_total // 2, 1), (n_rows_total - 1, 1)]:
                n_rows = min(n_rows, n_rows_total - row0)
                start = t.data_offset + row0 * row_bytes
                blob = np.array(raw[start:start + n_rows * row_bytes]).reshape(n_rows, row_bytes)
                vals = dequantize(blob, Q(ttype)).astype(np.float32).reshape(-1)
                assert vals.size == n_rows * row_elems
                recs.append((t.name, ttype, row0, n_rows, row_elems, vals))
    with open(os.path.join(DATA, "dequant_model.bin"), "wb") as fh:
        fh.write(b"BDQM" + struct.pack("<I", len(recs)))
        for name, ttype, row0, n_rows, row_elems, vals in recs:
            nb = name.encode()
            fh.write(struct.pack("<I", len(nb)) + nb)
            fh.write(struct.pack("<IIII", ttype, row0, n_rows, row_elems))
            fh.write(vals.astype("<f4").tobytes())
    return len(recs)


def rand_f16(n, lo=1e-3, hi=2.0):
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    sign = rng.choice([-1.0, 1.0], n)
    return (mag * sign).astype(np.float16)


def block_bytes(ttype, n_blocks):
    bs, tsz = gguf.GGML_QUANT_SIZES[ttype]
    b = rng.integers(0, 256, size=(n_blocks, tsz), dtype=np.uint8)
    def put(off, vals):
        b[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    if ttype in (Q.Q8_0, Q.Q4_0):
        put(0, rand_f16(n_blocks))
    elif ttype == Q.Q4_1:
        put(0, rand_f16(n_blocks))
        put(2, rand_f16(n_blocks))
    elif ttype in (Q.Q4_K, Q.Q5_K):
        put(0, rand_f16(n_blocks, 1e-4, 0.1))
        put(2, rand_f16(n_blocks, 1e-4, 0.1))
    elif ttype == Q.Q6_K:
        put(208, rand_f16(n_blocks, 1e-4, 0.1))
    return b


def write_blocks():
    recs = []
    # Plain float types: finite values, including subnormals and zeros.
    f32 = np.concatenate([rng.standard_normal(60).astype(np.float32) * 10,
                          np.array([0.0, -0.0, 1e-40, -3.0e38], dtype=np.float32)])
    recs.append((Q.F32, f32.view(np.uint8)))
    h = rng.integers(0, 0x10000, 256, dtype=np.uint16)
    h = h[((h >> 10) & 0x1F) != 0x1F][:64]          # no inf/NaN
    h[:4] = [0x0000, 0x8000, 0x0001, 0x83FF]        # zeros, subnormals
    recs.append((Q.F16, h.view(np.uint8)))
    b = rng.integers(0, 0x10000, 256, dtype=np.uint16)
    b = b[((b >> 7) & 0xFF) != 0xFF][:64]
    b[:3] = [0x0000, 0x8000, 0x0001]
    recs.append((Q.BF16, b.view(np.uint8)))
    for ttype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K, Q.Q6_K):
        n_blocks = 8 if gguf.GGML_QUANT_SIZES[ttype][0] == 32 else 3
        recs.append((ttype, block_bytes(ttype, n_blocks).reshape(-1)))
    out = []
    for ttype, raw in recs:
        bs, tsz = gguf.GGML_QUANT_SIZES[ttype]
        n_blocks = raw.size // tsz
        vals = dequantize(raw.reshape(n_blocks, tsz), ttype).astype(np.float32).reshape(-1)
        assert np.all(np.isfinite(vals)), ttype
        out.append((int(ttype), vals.size, raw.tobytes(), vals))
    with open(os.path.join(DATA, "dequant_blocks.bin"), "wb") as fh:
        fh.write(b"BDQB" + struct.pack("<I", len(out)))
        for ttype, n, raw, vals in out:
            fh.write(struct.pack("<III", ttype, n, len(raw)) + raw)
            fh.write(vals.astype("<f4").tobytes())
    return len(out)


def main():
    os.makedirs(DATA, exist_ok=True)
    r = gguf.GGUFReader(MODEL)
    write_meta(r)
    n_model = write_model_slices(r)
    n_blocks = write_blocks()
    print("wrote meta, %d model slices, %d block records (gguf %s)" % (
        n_model, n_blocks, importlib.metadata.version("gguf")))


if __name__ == "__main__":
    main()
