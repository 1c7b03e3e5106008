#!/usr/bin/env python3
"""Tiny Llama-3-style byte-level BPE GGUF ("llama-bpe" pre-tokenizer) and
golden vectors, for the pre-tokenizer that the default model does not use.

No Llama-3 GGUF is available, so this trains a small byte-level BPE with HF
`tokenizers` using Llama-3's tokenizer.json pre-tokenizer (its Split regex,
then ByteLevel without regex) and ignore_merges=True, on the same local text
as gen_tokenizer_spm.py, writes it as tests/data/tokenizer_llama3_tiny.gguf
(tokenizer.ggml.model "gpt2", pre "llama-bpe", special tokens as control
tokens), and records llama.cpp's ids (llama-cpp-python 0.3.36, vocab_only,
add_bos=False, special=False). HF `tokenizers` encodes the same strings as a
second reference; the script reports any disagreement between the two.

    /work/refvenv/bin/python tests/golden/gen_tokenizer_llama3.py
writes tests/data/tokenizer_llama3_tiny.gguf and
tests/data/tokenizer_llama3.txt (hex(utf-8) \\t llama.cpp ids).
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFWriter
from llama_cpp import Llama
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tokenizer_spm import corpus  # noqa: E402
from gen_tokenizer_smollm2 import BASE  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_GGUF = os.path.join(ROOT, "tests/data/tokenizer_llama3_tiny.gguf")
OUT_TXT = os.path.join(ROOT, "tests/data/tokenizer_llama3.txt")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]


def train():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def write_gguf(tok):
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    n = len(vocab)
    tokens = [None] * n
    for t, i in vocab.items():
        tokens[i] = t
    types = [3 if t in SPECIALS else 1 for t in tokens]
    w = GGUFWriter(OUT_GGUF, "llama")
    w.add_name("baton tiny llama-bpe test vocabulary")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|begin_of_text|>"])
    w.add_eos_token_id(vocab["<|end_of_text|>"])
    w.add_add_bos_token(True)
    w.add_tensor("token_embd.weight", np.zeros((1,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", OUT_GGUF, os.path.getsize(OUT_GGUF), "bytes,", n, "tokens,", len(merges), "merges")


def main():
    tok = train()
    write_gguf(tok)
    llm = Llama(model_path=OUT_GGUF, vocab_only=True, verbose=False)
    extra = ["I'M FINE 'S 'T 'Re 'vE", "12345678", "1234 56", "a\r\nb", "x \r\n\r\n y", "foo!!!\n\nbar",
             "  \n\n  z", "tab\t\tz", "émigré's", "ВАСЯ's", "+-+-\n", "<|eot_id|>", "{\n  \"a\": 1\n}\n"]
    n_diff = 0
    with open(OUT_TXT, "w") as f:
        f.write("# hex(utf-8)\tllama.cpp ids (llama-cpp-python 0.3.36, vocab_only, special=False)\n")
        for s in BASE + extra:
            ids = llm.tokenize(s.encode(), add_bos=False, special=False)
            hf = tok.encode(s, add_special_tokens=False).ids if "<|" not in s else ids
            if hf != ids:
                n_diff += 1
                print("llama.cpp and HF differ on %r: %s vs %s" % (s[:40], ids[:12], hf[:12]))
            f.write("%s\t%s\n" % (s.encode().hex(), " ".join(map(str, ids))))
    print("wrote", OUT_TXT, len(BASE) + len(extra), "cases;", n_diff, "llama.cpp/HF disagreements")


if __name__ == "__main__":
    main()
