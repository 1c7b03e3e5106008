#!/usr/bin/env python3
"""Tiny SentencePiece-BPE model as a GGUF, and golden vectors from
SentencePiece itself, for baton's "llama" (SPM) tokenizer path.

No Llama-2 GGUF is available, so this trains a small BPE model with the
`sentencepiece` package (0.2.x) on text that ships with Debian and Python
(licence texts and a few stdlib modules) plus some fixed multilingual lines,
with Llama-2's settings (identity normalization, no whitespace collapsing,
dummy prefix, byte fallback, split digits), then writes its pieces, scores
and types into tests/data/tokenizer_spm_tiny.gguf with the `gguf` package's
GGUFWriter (tokenizer.ggml.model = "llama", Llama-2 chat template).

Golden: tests/data/tokenizer_spm.txt, one case per line:
    hex(utf-8 input) \t ids from sp.encode(s) \t hex(sp.decode(ids))
Run with the reference venv (development time only):
    /work/refvenv/bin/python tests/golden/gen_tokenizer_spm.py
"""
import glob
import os
import random
import tempfile

import numpy as np
import sentencepiece as spm
from gguf import GGUFWriter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_GGUF = os.path.join(ROOT, "tests/data/tokenizer_spm_tiny.gguf")
OUT_TXT = os.path.join(ROOT, "tests/data/tokenizer_spm.txt")

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

EXTRA = """Hello world. The quick brown fox jumps over the lazy dog.
Grüße aus München! Ça va? Él está aquí. Ünïcödé naïve café résumé.
日本語の文章です。中文测试文本。한국어 문장입니다.
Привет, как дела? Всё хорошо.
def main():\n    print("hello")\n    return 0
for (int i = 0; i < 10; i++) { sum += i; }
1234567890 3.14159 2024-06-01 100% $5.00
"""


def corpus():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))[:8]
    files += [f for f in ["/usr/lib/python3.11/json/decoder.py", "/usr/lib/python3.11/textwrap.py",
                          "/usr/lib/python3.11/string.py"] if os.path.exists(f)]
    text = []
    for f in files:
        if os.path.isfile(f):
            with open(f, encoding="utf-8", errors="replace") as fh:
                text.append(fh.read())
    text.append(EXTRA * 20)
    lines = [l for l in "\n".join(text).split("\n") if l.strip()]
    return lines


def train(tmp):
    inp = os.path.join(tmp, "corpus.txt")
    with open(inp, "w") as f:
        f.write("\n".join(corpus()))
    prefix = os.path.join(tmp, "tiny")
    spm.SentencePieceTrainer.train(
        input=inp, model_prefix=prefix, vocab_size=1200, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def write_gguf(sp):
    n = sp.get_piece_size()
    tokens, scores, types = [], [], []
    for i in range(n):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_unused(i):
            t = 5
        elif sp.is_byte(i):
            t = 6
        else:
            t = 1
        types.append(t)
    w = GGUFWriter(OUT_GGUF, "llama")
    w.add_name("baton tiny sentencepiece test vocabulary")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(LLAMA2_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((1,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", OUT_GGUF, os.path.getsize(OUT_GGUF), "bytes,", n, "pieces")


BASE = [
    "", " ", "  ", "a", " a", "  a", "a ", "a  b", "Hello world", " Hello world", "Hello  world ",
    "Hello\nworld", "Hello\n\nworld", "\n", "\t", "tab\there", "\r\n", "line1\r\nline2",
    "The quick brown fox jumps over the lazy dog.", "GNU GENERAL PUBLIC LICENSE",
    "Permission is hereby granted, free of charge, to any person", "THE SOFTWARE IS PROVIDED \"AS IS\"",
    "1", "12", "2024", "3.14159", "1234567890", "9" * 40, "Grüße aus München!", "Ça va? Él está aquí.",
    "naïve café résumé", "e\u0301", "日本語の文章です。", "中文测试文本", "한국어", "Привет, как дела?",
    "Ελληνικά", "مرحبا", "😀", "Hello 😀", "👍🏽👨‍👩‍👧", "\u00a0nbsp", "zero\u200bwidth", "\ufeffbom",
    "\ufffd", "\U0010ffff", "<s>", "</s>", "<unk>", "<0x41>", "[INST] hi [/INST]", "<<SYS>>\n",
    "def main():\n    print(\"hello\")\n    return 0\n", "for (int i = 0; i < 10; i++) { sum += i; }",
    "{\"a\": [1, 2]}", "x=y+z*2", "a" * 200, "ab " * 60, "z" * 500, "▁", "▁▁x", "_ underscore_",
    "    indented", "trailing   ", "mixed \t \n spaces", "It's don't we'll", "@#$%^&*()", "~`|\\",
]
PIECES = ["Hello", " world", " ", "  ", "\n", "the", " licen", "se", "123", "é", "日本", "😀", "\t",
          "software", "GNU", ",", ".", "ü", "ß", "Ω", "x", "<s>", "--", "'s"]


def cases():
    out = list(BASE)
    rnd = random.Random(7)
    while len(out) < 130:
        out.append("".join(rnd.choice(PIECES) for _ in range(rnd.randint(1, 6))))
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        sp = train(tmp)
        write_gguf(sp)
        with open(OUT_TXT, "w") as f:
            f.write("# hex(utf-8)\tsentencepiece %s encode ids\thex(sentencepiece decode)\n" % spm.__version__)
            for s in cases():
                ids = sp.encode(s)
                dec = sp.decode(ids)
                f.write("%s\t%s\t%s\n" % (s.encode().hex(), " ".join(map(str, ids)), dec.encode().hex()))
        print("wrote", OUT_TXT, len(cases()), "cases")


if __name__ == "__main__":
    main()
