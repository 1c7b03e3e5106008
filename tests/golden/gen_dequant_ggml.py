#!/usr/bin/env python3
"""Second reference for the dequantization goldens: ggml itself.

Run with the reference venv (llama-cpp-python ships libggml-base.so):

    /work/refvenv/bin/python tests/golden/gen_dequant_ggml.py [model.gguf]

1. Writes tests/data/dequant_ggml_types.txt: for every ggml type number
   below GGML_TYPE_COUNT (llama_cpp.llama_cpp.GGML_TYPE_COUNT), "type name block_elems block_bytes" from
   ggml_type_name / ggml_blck_size / ggml_type_size ("-" 0 0 for removed
   numbers).
2. Checks that ggml's dequantize_row_* (and fp16/bf16 row converters) give
   bit-identical floats to the gguf-package values stored in
   tests/data/dequant_blocks.bin and tests/data/dequant_model.bin (written
   by gen_dequant.py); exits non-zero if not.
"""
import ctypes
import glob
import os
import struct
import sys

import numpy as np
import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf")

import llama_cpp  # noqa: E402  (only to locate its bundled ggml)
LIBDIR = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
ggml = ctypes.CDLL(glob.glob(os.path.join(LIBDIR, "libggml-base.so"))[0])
ggml.ggml_type_size.restype = ctypes.c_size_t
ggml.ggml_blck_size.restype = ctypes.c_int64
ggml.ggml_type_name.restype = ctypes.c_char_p
ggml.ggml_type_name.argtypes = [ctypes.c_int]
ggml.ggml_type_size.argtypes = [ctypes.c_int]
ggml.ggml_blck_size.argtypes = [ctypes.c_int]

ROW_FN = {0: None, 1: "ggml_fp16_to_fp32_row", 30: "ggml_bf16_to_fp32_row",
          8: "dequantize_row_q8_0", 2: "dequantize_row_q4_0", 3: "dequantize_row_q4_1",
          12: "dequantize_row_q4_K", 13: "dequantize_row_q5_K", 14: "dequantize_row_q6_K"}


def ggml_dequant(ttype, raw, n):
    src = np.frombuffer(raw, dtype=np.uint8).copy()
    if ttype == 0:
        return src.view(np.float32).copy()
    out = np.zeros(n, dtype=np.float32)
    fn = getattr(ggml, ROW_FN[ttype])
    fn.restype = None
    fn(src.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return out


def write_types():
    from llama_cpp.llama_cpp import GGML_TYPE_COUNT
    lines = []
    for t in range(GGML_TYPE_COUNT):
        bs, ts = ggml.ggml_blck_size(t), ggml.ggml_type_size(t)
        if bs == 0:
            lines.append("%d - 0 0" % t)
        else:
            lines.append("%d %s %d %d" % (t, ggml.ggml_type_name(t).decode(), bs, ts))
    with open(os.path.join(DATA, "dequant_ggml_types.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return len(lines)


def check_blocks():
    buf = open(os.path.join(DATA, "dequant_blocks.bin"), "rb").read()
    assert buf[:4] == b"BDQB"
    (count,) = struct.unpack_from("<I", buf, 4)
    p, bad = 8, 0
    for _ in range(count):
        ttype, n, nb = struct.unpack_from("<III", buf, p)
        p += 12
        raw = buf[p:p + nb]
        want = np.frombuffer(buf, dtype="<f4", count=n, offset=p + nb)
        p += nb + 4 * n
        got = ggml_dequant(ttype, raw, n)
        same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        print("blocks %-5s %4d values: %s" % (gguf.GGMLQuantizationType(ttype).name, n,
                                              "identical" if same else "DIFFERENT"))
        bad += not same
    return bad


def check_model():
    r = gguf.GGUFReader(MODEL)
    by_name = {t.name: t for t in r.tensors}
    raw = np.memmap(MODEL, dtype=np.uint8, mode="r")
    buf = open(os.path.join(DATA, "dequant_model.bin"), "rb").read()
    (count,) = struct.unpack_from("<I", buf, 4)
    p, bad = 8, 0
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", buf, p)
        name = buf[p + 4:p + 4 + nl].decode()
        p += 4 + nl
        ttype, row0, n_rows, row_elems = struct.unpack_from("<IIII", buf, p)
        p += 16
        n = n_rows * row_elems
        want = np.frombuffer(buf, dtype="<f4", count=n, offset=p)
        p += 4 * n
        bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        rb = row_elems // bs * ts
        start = by_name[name].data_offset + row0 * rb
        got = ggml_dequant(ttype, bytes(raw[start:start + n_rows * rb]), n)
        same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        bad += not same
        if not same:
            print("model %s rows %d+%d DIFFERENT" % (name, row0, n_rows))
    print("model slices: %d of %d identical to ggml" % (count - bad, count))
    return bad


def main():
    n = write_types()
    print("wrote %d ggml types" % n)
    bad = check_blocks() + check_model()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
