"""Chat templates on generated GGUFs: our rendering against jinja2 rendering
(as HF's apply_chat_template sets it up) of Llama 3, Llama 2, Mistral and
ChatML templates with and without a default system prompt. Our text leaves
out the leading BOS that a template prints (hkv_tokenize adds it), so it is
compared with the Jinja text minus that BOS. An unrecognised template is
HKV_E_UNSUPPORTED. Needs no model. Usage: test_chat_templates.py TOK_TOOL [MODEL]

The template texts are the published ones of these model families (written
out here as test inputs)."""
import os
import sys
import tempfile

import tokref

tokref.need("gguf", "numpy", "jinja2")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}"
           "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
           "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
           "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
# Qwen2-style ChatML: default system text in an escaped literal, in an else branch.
QWEN = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant. It\\'s \"quoted\".<|im_end|>\\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
GEMMA = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n{% endfor %}"

FAMILIES = {  # name: (template, family, bos text, eos text, conversations may hold a system message)
    "llama3": (LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", True),
    "llama2": (LLAMA2, "llama2", "<s>", "</s>", True),
    "mistral": (MISTRAL, "mistral", "<s>", "</s>", False),
    "qwen": (QWEN, "chatml", "<|endoftext|>", "<|im_end|>", True),
    "chatml": (CHATML, "chatml", "<|endoftext|>", "<|im_end|>", True),
    "none": (None, "chatml", "<|endoftext|>", "<|im_end|>", True),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Why is the sky blue?\n"}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": " uno "},
     {"role": "user", "content": "two ✓ café"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
     {"role": "user", "content": "z"}],
]


def render_jinja(tmpl, messages, gen, bos, eos):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(msg)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(tmpl).render(messages=messages, add_generation_prompt=gen, bos_token=bos,
                                        eos_token=eos)


def make_gguf(path, tmpl, bos, eos):
    u = tokref.bytes_to_unicode()
    tokens = [u[b] for b in range(256)] + [bos, eos, "ab"]
    types = [1] * 256 + [3, 3, 1]
    tokref.write_gguf(path, "gpt2", tokens, types, merges=["a b"], pre="gpt2", bos=256, eos=257, template=tmpl)


def main():
    tool = tokref.Tool(sys.argv[1])
    chk = tokref.Checker("chat_templates")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (tmpl, fam, bos, eos, sys_ok) in FAMILIES.items():
            g = os.path.join(tmp, name + ".gguf")
            make_gguf(g, tmpl, bos, eos)
            info = dict(line.split("=", 1) for line in tool.run("info", g).decode().split("\n") if line)
            chk.eq(info["family"], fam, "%s: family" % name)
            for conv in CONVERSATIONS:
                if not sys_ok and conv[0]["role"] == "system":
                    continue
                for gen in (True, False):
                    args = [x for m in conv for x in (m["role"], m["content"])]
                    ours = tool.run("chat", g, int(gen), *args).decode()
                    if tmpl is None:   # no template: plain ChatML, no default system
                        want = render_jinja(CHATML, conv, gen, bos, eos)
                    else:
                        want = render_jinja(tmpl, conv, gen, bos, eos)
                    if want.startswith(bos):
                        want = want[len(bos):]
                    chk.eq(ours, want, "%s: conversation %r gen=%s" % (name, conv[-1]["content"][:12], gen))
        g = os.path.join(tmp, "gemma.gguf")
        make_gguf(g, GEMMA, "<bos>", "<eos>")
        try:
            tool.run("chat", g, 1, "user", "hi")
            chk.eq("succeeded", "failed", "unknown template must be refused")
        except RuntimeError as e:
            chk.eq("status=UNSUPPORTED" in str(e) and "chat_template" in str(e), True,
                   "unknown template: UNSUPPORTED naming the template (%s)" % str(e).strip()[-200:])
        # The file still tokenizes: only chat needs a known template.
        chk.eq(tool.encode(g, tokref.write_text(tmp, "bab")), [ord("b"), 258], "encode without a usable template")
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())
