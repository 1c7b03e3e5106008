"""Reference logits and greedy continuations of the default model
(SmolLM2-135M-Instruct Q4_1) from llama.cpp, through llama-cpp-python.

    /work/refvenv/bin/python tests/golden/gen_model_ref.py [model] [out]
    (default model ~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf,
     out tests/data/model_ref.bin)

Development-time only: ctest reads the output file, never this script.

Two llama.cpp references:
  "exact": the same weights dequantized to F32 by llama.cpp itself
           (llama_model_quantize with LLAMA_FTYPE_ALL_F32: Q4_1/Q8_0 -> F32 is
           exact) and an F32 KV cache, so llama.cpp computes in fp32 like
           baton's CPU backend. Differences should be fp32 rounding only.
  "stock": the Q4_1 file as llama.cpp runs it by default: activations are
           quantized to Q8 blocks before each quantized dot product and the
           KV cache is F16, so logits differ by a few tenths.
Prompts are tokenized by llama.cpp and the ids stored, so the C test does not
depend on baton's tokenizer.

File (little-endian):
    char magic[4] = "BRF2"; int32 n_prompts, n_vocab, n_top
    per prompt:
      int32 n_prompt; int32 ids[n_prompt]
      float32 exact_last[n_vocab]          exact logits of the last prompt position
      int32 stock_top_ids[n_top]; float32 stock_top_logits[n_top]   (best first)
      float32 stock_std                    std of the stock last-position logits
      int32 n_gen; int32 exact_gen[n_gen]; float32 exact_margin[n_gen]
      int32 n_gen; int32 stock_gen[n_gen]; float32 stock_margin[n_gen]
    margin = top-1 minus top-2 logit of the reference at that greedy step.
"""
import ctypes
import os
import sys
import tempfile

import numpy as np
import llama_cpp

N_GEN = 40
N_TOP = 64


def chat(q):
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = [
    chat("What is the capital of France?"),
    chat("Write a Python function that returns the sum of a list."),
    chat("Name three primary colors."),
    chat("Tell me a short story about a cat."),
]


def greedy(llm, ids):
    llm.reset()
    llm.eval(ids)
    gen, margins = [], []
    for _ in range(N_GEN):
        l = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top2 = np.sort(l)[-2:]
        t = int(l.argmax())
        gen.append(t)
        margins.append(float(top2[1] - top2[0]))
        if t == llm.token_eos():
            break
        llm.eval([t])
    return gen, margins


def last_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "data", "model_ref.bin")
    tmp = tempfile.mkdtemp()
    f32_path = os.path.join(tmp, "model_f32.gguf")
    qp = llama_cpp.llama_model_quantize_default_params()
    qp.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    qp.allow_requantize = True
    if llama_cpp.llama_model_quantize(model.encode(), f32_path.encode(), ctypes.byref(qp)) != 0:
        sys.exit("llama_model_quantize to F32 failed")
    common = dict(n_ctx=512, logits_all=True, verbose=False, n_threads=2, seed=0)
    stock = llama_cpp.Llama(model_path=model, **common)
    exact = llama_cpp.Llama(model_path=f32_path, type_k=0, type_v=0, **common)  # GGML_TYPE_F32 KV
    n_vocab = stock.n_vocab()
    with open(out, "wb") as f:
        f.write(b"BRF2")
        np.array([len(PROMPTS), n_vocab, N_TOP], dtype="<i4").tofile(f)
        for text in PROMPTS:
            ids = stock.tokenize(text.encode(), add_bos=False, special=True)
            ex = last_logits(exact, ids)
            st = last_logits(stock, ids)
            order = np.argsort(-st, kind="stable")[:N_TOP]
            eg, em = greedy(exact, ids)
            sg, sm = greedy(stock, ids)
            print(f"{len(ids):3d} prompt tokens; exact vs stock logits max |diff| {np.abs(ex - st).max():.3f}; "
                  f"exact {len(eg)} tokens (min margin {min(em):.3f}), stock {len(sg)} (min margin {min(sm):.3f}): "
                  f"{exact.detokenize(eg).decode(errors='replace')!r}", file=sys.stderr)
            np.array([len(ids)], dtype="<i4").tofile(f)
            np.array(ids, dtype="<i4").tofile(f)
            ex.astype("<f4").tofile(f)
            order.astype("<i4").tofile(f)
            st[order].astype("<f4").tofile(f)
            np.array([st.std()], dtype="<f4").tofile(f)
            for g, m in ((eg, em), (sg, sm)):
                np.array([len(g)], dtype="<i4").tofile(f)
                np.array(g, dtype="<i4").tofile(f)
                np.array(m, dtype="<f4").tofile(f)
    os.remove(f32_path)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
