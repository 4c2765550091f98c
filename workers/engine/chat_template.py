"""Render a model's Jinja chat template (from GGUF or tokenizer_config.json): messages -> prompt.

Templates come with model files, so they are untrusted code: they run in Jinja's immutable
sandbox. The environment mirrors what ``transformers.apply_chat_template`` offers
(``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``, ``strftime_now``, loop
controls) so that templates written for Hugging Face render identically here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: the template refused it or is broken."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    # Like transformers: no HTML escaping (Jinja's builtin tojson escapes <, >, &, ').
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], autoescape=False
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _plain_content(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message with OpenAI content parts (``[{"type": "text", ...}]``) joined into a string."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ChatTemplateError(
                    f"content part of type {kind!r} is not supported; send text"
                )
            texts.append(str(part.get("text", "")))
        out["content"] = "".join(texts)
    return out


class ChatTemplate:
    """One compiled chat template plus the special tokens it may refer to."""

    def __init__(
        self, source: str, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        env = _environment()
        try:
            self._template = env.from_string(source)
            variables = jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc
        self._tokens = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        #: the Jinja source (what the format of the model's tool calls is read from)
        self.source = source
        #: whether the template renders tool definitions (reads a ``tools`` variable)
        self.takes_tools = "tools" in variables

    def __call__(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        """:meth:`render` with the generation prompt: what the server calls."""
        return self.render(messages, **extra)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages``; ``add_generation_prompt`` opens the assistant turn.

        ``extra`` reaches the template as variables (e.g. ``tools``). Errors raised by the
        template (``raise_exception``) or by the sandbox become ``ChatTemplateError``.
        """
        context = {
            **self._tokens,
            **extra,
            "messages": [_plain_content(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(context)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:  # SecurityError, UndefinedError, ...
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        except (TypeError, KeyError, ValueError) as exc:  # e.g. content of the wrong type
            raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc
