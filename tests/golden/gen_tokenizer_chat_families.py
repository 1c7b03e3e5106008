#!/usr/bin/env python3
"""Golden renderings of the chat template families that baton recognises.

The Jinja texts below are the templates published with Llama-3-Instruct,
Gemma-2-it, Phi-3-mini-instruct and Llama-2-chat (tokenizer_config.json
"chat_template"), rendered with jinja2 and tokenized by llama.cpp
(llama-cpp-python 0.3.36, vocab_only, special=True). Llama-3, Gemma and
Phi-3 are rendered against the SmolLM2 vocabulary (bos_token "", eos_token
"<|im_end|>", as that model adds no BOS: their scaffolding tokens are plain
text there); Llama-2 against tests/data/tokenizer_spm_tiny.gguf (bos "<s>",
eos "</s>").

    /work/refvenv/bin/python tests/golden/gen_tokenizer_chat_families.py
writes tests/data/tokenizer_chat_families.txt:
    template <family> <smollm2|spm> <hex(template)>
    case <n_messages> <add_generation_prompt>
    <role>\t<hex(content)>   (n lines)
    text\t<hex(jinja rendering)>
    ids\t<llama.cpp ids of the rendering>
"""
import os
import sys

import jinja2
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOL = os.path.expanduser("~/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf")
SPM = os.path.join(ROOT, "tests/data/tokenizer_spm_tiny.gguf")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
         "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
         "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
         "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
         "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
         "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{'<start_of_turn>model\n'}}{% endif %}")
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
        "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tokenizer_spm import LLAMA2_TEMPLATE as LLAMA2  # noqa: E402

WITH_SYS = [
    ([("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Bye")], True),
    ([("system", "  padded system  "), ("user", "  padded user \n")], True),
]
NO_SYS = [
    ([("user", "Hello!")], True),
    ([("user", "What is the capital of France?")], True),
    ([("user", "Hi"), ("assistant", " Hello, how can I help? ")], False),
    ([("user", "Line1\nLine2\n\nLine3\r\n")], True),
    ([("user", "日本語 😀 é"), ("assistant", "OK 👍"), ("user", "x")], True),
    ([("user", "def f(x):\n    return 1")], True),
]

FAMILIES = [
    ("llama3", "smollm2", LLAMA3, "", "<|im_end|>", WITH_SYS + NO_SYS),
    ("gemma", "smollm2", GEMMA, "", "<|im_end|>", NO_SYS),
    ("phi3", "smollm2", PHI3, "", "<|im_end|>", WITH_SYS + NO_SYS),
    ("llama2", "spm", LLAMA2, "<s>", "</s>", WITH_SYS + NO_SYS),
]


def main():
    toks = {"smollm2": Llama(model_path=SMOL, vocab_only=True, verbose=False),
            "spm": Llama(model_path=SPM, vocab_only=True, verbose=False)}
    env = jinja2.Environment()
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(Exception(m))
    path = os.path.join(ROOT, "tests/data/tokenizer_chat_families.txt")
    n = 0
    with open(path, "w") as f:
        for fam, vocab, text, bos, eos, chats in FAMILIES:
            tpl = env.from_string(text)
            f.write("template %s %s %s\n" % (fam, vocab, text.encode().hex()))
            for msgs, gen in chats:
                out = tpl.render(messages=[{"role": r, "content": c} for r, c in msgs],
                                 add_generation_prompt=gen, bos_token=bos, eos_token=eos)
                ids = toks[vocab].tokenize(out.encode(), add_bos=False, special=True)
                f.write("case %d %d\n" % (len(msgs), int(gen)))
                for r, c in msgs:
                    f.write("%s\t%s\n" % (r, c.encode().hex()))
                f.write("text\t%s\n" % out.encode().hex())
                f.write("ids\t%s\n" % " ".join(map(str, ids)))
                n += 1
    print("wrote", path, n, "cases")


if __name__ == "__main__":
    main()
