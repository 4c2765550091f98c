"""Chat templates: SmolLM2's from its GGUF, and the sandbox/error behaviour of the renderer."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.engine.chat_template import ChatTemplate, ChatTemplateError
from workers.engine.tokenizer import load_tokenizer

DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n"
)


def test_smollm2_template_renders_chatml(smollm2_gguf: Path) -> None:
    tok = load_tokenizer(smollm2_gguf)
    prompt = tok.render_chat([{"role": "user", "content": "Hi"}])
    assert prompt == DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

    own_system = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
    ]
    assert tok.render_chat(own_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nAB<|im_end|>\n"
    )


def test_raise_exception_becomes_chat_template_error() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "x"
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        template.render([{"role": "tool", "content": "x"}])


def test_templates_run_sandboxed() -> None:
    escape = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        escape.render([])
    mutate = ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}{{ messages | length }}")
    with pytest.raises(ChatTemplateError):
        mutate.render([{"role": "user", "content": "a"}])


def test_template_helpers_and_errors() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}",
        bos_token="<s>",
    )
    assert template.render([{"role": "user", "content": "<é>"}]) == (
        '<s>{"role": "user", "content": "<é>"}|4'
    )
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="image_url"):
        template.render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
