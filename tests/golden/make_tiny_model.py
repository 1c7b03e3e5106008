"""Writes the tiny random-weight GGUF models and their golden logits used by
baton's unit tests (tests/data/tiny_*).

    .venv/bin/python tests/golden/make_tiny_model.py [outdir]   (default tests/data)

Models (2 layers, n_embd 64, 4 query heads, 2 KV heads (GQA), head_dim 16,
ffn 128, vocab 272 = 3 special tokens + 256 GPT-2 byte tokens + 13 merges,
a minimal byte-level BPE "gpt2" tokenizer and a ChatML template so that the
file loads like a real one; context length 96):

  tiny_llama.gguf   arch llama: Q8_0 attention, Q4_1 FFN, F32 norms, F16
                    token_embd, tied output (no output.weight), llama-3 style
                    rope_freqs.weight, rope base 10000
  tiny_qwen2.gguf   arch qwen2: F32 everything, QKV biases, separate
                    output.weight, NeoX rope, linear rope scaling (factor 2)
  tiny_unsupported_type.gguf  tiny_llama with blk.0.ffn_up.weight in Q5_0
                    (a type baton does not convert: load must fail naming it)

Golden logits: tiny_<arch>.logits, little-endian binary
    int32 n_tokens, int32 n_vocab, int32 tokens[n_tokens],
    float32 logits[n_tokens][n_vocab]
from tests/golden/numpy_llama.py (float64 NumPy forward on the weights as
dequantized by the gguf package) for a fixed 40-token sequence.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_llama import ReferenceModel  # noqa: E402

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 2, 64, 4, 2, 128, 96
HEAD_DIM = N_EMBD // N_HEAD


def bytes_to_unicode():
    # GPT-2's byte <-> printable unicode table (openai/gpt-2 encoder.py)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def vocab():
    b2u = bytes_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_toks = [b2u[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t", "Ġ w", "Ġ i", "e n"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = specials + byte_toks + merged
    types = [3] * len(specials) + [1] * (len(byte_toks) + len(merged))  # 3 = CONTROL, 1 = NORMAL
    return tokens, types, merges


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_model(path, arch, rng, unsupported=False):
    tokens, types, merges = vocab()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(N_LAYER)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(n_vocab)
    if arch == "llama":
        w.add_rope_freq_base(10000.0)
    else:
        w.add_rope_freq_base(1000000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def mat(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def add(name, a, qtype=QT.F32):
        if qtype == QT.F32:
            w.add_tensor(name, a)
        elif qtype == QT.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    quant_attn = QT.Q8_0 if arch == "llama" else QT.F32
    quant_ffn = QT.Q4_1 if arch == "llama" else QT.F32
    add("token_embd.weight", mat(n_vocab, N_EMBD, 1.0), QT.F16 if arch == "llama" else QT.F32)
    if arch == "llama":
        add("rope_freqs.weight", np.linspace(1.0, 4.0, HEAD_DIM // 2).astype(np.float32))
    for l in range(N_LAYER):
        p = f"blk.{l}."
        add(p + "attn_norm.weight", (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32))
        add(p + "attn_q.weight", mat(N_EMBD, N_EMBD, 0.25), quant_attn)
        add(p + "attn_k.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD, 0.25), quant_attn)
        add(p + "attn_v.weight", mat(N_HEAD_KV * HEAD_DIM, N_EMBD, 0.25), quant_attn)
        if arch == "qwen2":
            add(p + "attn_q.bias", (0.5 * rng.standard_normal(N_EMBD)).astype(np.float32))
            add(p + "attn_k.bias", (0.5 * rng.standard_normal(N_HEAD_KV * HEAD_DIM)).astype(np.float32))
            add(p + "attn_v.bias", (0.5 * rng.standard_normal(N_HEAD_KV * HEAD_DIM)).astype(np.float32))
        add(p + "attn_output.weight", mat(N_EMBD, N_EMBD, 0.15), quant_attn)
        add(p + "ffn_norm.weight", (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32))
        add(p + "ffn_gate.weight", mat(N_FF, N_EMBD, 0.2), quant_ffn)
        add(p + "ffn_up.weight", mat(N_FF, N_EMBD, 0.2),
            QT.Q5_0 if (unsupported and l == 0) else quant_ffn)
        add(p + "ffn_down.weight", mat(N_EMBD, N_FF, 0.15), quant_ffn)
    add("output_norm.weight", (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32))
    if arch == "qwen2":
        add("output.weight", mat(n_vocab, N_EMBD, 0.3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_logits(model_path, out_path, tokens):
    ref = ReferenceModel(model_path)
    logits = ref.forward(tokens).astype(np.float32)
    with open(out_path, "wb") as f:
        np.array([len(tokens), logits.shape[1]], dtype="<i4").tofile(f)
        np.asarray(tokens, dtype="<i4").tofile(f)
        logits.astype("<f4").tofile(f)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data")
    os.makedirs(out, exist_ok=True)
    seq = [int(t) for t in np.random.default_rng(7).integers(0, 272, size=40)]
    for arch, seed in (("llama", 1), ("qwen2", 2)):
        path = os.path.join(out, f"tiny_{arch}.gguf")
        write_model(path, arch, np.random.default_rng(seed))
        write_logits(path, os.path.join(out, f"tiny_{arch}.logits"), seq)
    write_model(os.path.join(out, "tiny_unsupported_type.gguf"), "llama", np.random.default_rng(1), unsupported=True)


if __name__ == "__main__":
    main()
