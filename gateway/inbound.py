"""Reading an OpenAI request: validate it against the plan and prepare what the worker gets.

The gateway does not re-implement the workers' validation: it checks only what it must
know to admit, route and meter (model, stream, ``max_tokens``, prompt size) and passes
every other field through untouched, including SGLang's extras (``min_tokens``, ``seed``,
``top_k``, ``stop_token_ids``, ``ignore_eos``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.accounts import Plan
from gateway.errors import ApiError
from gateway.router import point
from protocol.fields import CACHE_SALT_FIELDS

#: Characters per token assumed when sizing a prompt before a tokenizer has seen it.
_CHARS_PER_TOKEN = 4
#: How much of the conversation's start names it when the client gives no session id.
_SESSION_PREFIX_CHARS = 512
#: Most choices one request may ask for (OpenAI's own limit on ``n``).
MAX_CHOICES = 128
#: ``max_tokens`` of a text completion that names none (OpenAI's default there).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass
class Inbound:
    """A validated request."""

    chat: bool
    body: dict[str, Any]
    model: str
    stream: bool
    #: Whether the client asked for the usage chunk at the end of a stream.
    wants_usage: bool
    #: Whether it also asked for usage on every chunk (``continuous_usage_stats``).
    wants_continuous_usage: bool
    max_tokens: int
    prompt_estimate: int
    #: choices asked for (``n``)
    choices: int = 1

    @property
    def cost(self) -> int:
        """Tokens reserved at admission: the estimated prompt plus every possible completion."""
        return self.prompt_estimate + self.max_tokens * self.choices

    def session(self, header: str | None) -> str:
        """The session key: ``X-Session-Id``, else ``user``, else the conversation's start."""
        if header:
            return "h:" + header
        user = self.body.get("user")
        if isinstance(user, str) and user:
            return "u:" + user
        if self.chat:
            start = []
            for message in self.body["messages"]:
                start.append(_text(message.get("content")))
                if message.get("role") == "user":
                    break  # the first user turn: the same in every later turn
            opening = "\x1e".join(start)
        else:
            prompt = self.body["prompt"]
            opening = prompt if isinstance(prompt, str) else _text(prompt)
        return f"c:{point(opening[:_SESSION_PREFIX_CHARS]):x}"

    def upstream_body(self, cache_salt: str) -> bytes:
        """The body for the worker: the tenant's cache salt set, usage always requested.

        A stream asks for usage on every chunk (``continuous_usage_stats``, as SGLang and
        vLLM name it), so that a stream cut short by either end is still metered with the
        tokens it delivered; :mod:`gateway.proxy` gives the client only what it asked for.
        """
        body = dict(self.body)
        for name in CACHE_SALT_FIELDS:
            body[name] = cache_salt
        body["max_tokens"] = self.max_tokens
        body.pop("max_completion_tokens", None)
        if self.stream:
            options = body.get("stream_options") or {}
            body["stream_options"] = {
                **options,
                "include_usage": True,
                "continuous_usage_stats": True,
            }
        return orjson.dumps(body)


def parse(raw: bytes, *, chat: bool, plan: Plan) -> Inbound:
    """Validate ``raw`` for ``plan``; raises :class:`ApiError` 400 saying what to fix."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required: name a model from GET /v1/models.", param="model")
    text = _chat_text(body) if chat else _prompt_text(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")
    wants_usage = bool(stream and options and options.get("include_usage"))
    continuous = wants_usage and bool(options and options.get("continuous_usage_stats"))
    choices = _choices(body)
    max_tokens = _max_tokens(body, plan, chat=chat)
    estimate = len(text) // _CHARS_PER_TOKEN + 1
    if estimate + max_tokens > plan.max_context:
        raise ApiError(
            400,
            f"This request needs about {estimate} prompt + {max_tokens} completion tokens; "
            f"your plan allows a context of {plan.max_context}. Shorten the prompt or lower "
            "max_tokens.",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    return Inbound(
        chat, body, model, stream, wants_usage, continuous, max_tokens, estimate, choices
    )


def _choices(body: dict[str, Any]) -> int:
    """``n``, checked here because admission multiplies the reservation by it."""
    value = body.get("n")
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CHOICES:
        raise ApiError(400, f"'n' must be an integer from 1 to {MAX_CHOICES}.", param="n")
    return value


def _max_tokens(body: dict[str, Any], plan: Plan, *, chat: bool) -> int:
    """The completion cap: the client's, checked against the plan, else the default.

    With none given, a text completion gets OpenAI's 16 tokens and a chat completion the
    plan's most.
    """
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    value = body.get(name)
    if value is None:
        if chat:
            return plan.max_max_tokens
        return min(COMPLETIONS_DEFAULT_MAX_TOKENS, plan.max_max_tokens)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"'{name}' must be a positive integer.", param=name)
    if value > plan.max_max_tokens:
        raise ApiError(
            400,
            f"'{name}' is {value}; your plan allows at most {plan.max_max_tokens}.",
            param=name,
        )
    return value


def _chat_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    if not all(isinstance(m, dict) for m in messages):
        raise ApiError(
            400, "Each message must be an object with role and content.", param="messages"
        )
    return "".join(_text(m.get("content")) for m in messages)


def _prompt_text(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        return _text(prompt)
    raise ApiError(400, "'prompt' must be a string or a non-empty list.", param="prompt")


def _text(content: Any) -> str:
    """Text of a message content or prompt list; token ids count as one token each."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, int):
                parts.append("x" * _CHARS_PER_TOKEN)
            else:
                parts.append(_text(part))
        return "".join(parts)
    return "" if content is None else str(content)
