"""Reading an OpenAI request: validate it against the plan and prepare what the worker gets.

The gateway validates a body with the schema the workers use (:mod:`protocol.openai_requests`),
so what it admits a worker serves; on top it checks what the plan limits (``max_tokens``,
the prompt's size) and what it must know to admit, route and meter. It passes the body on
as the client sent it, SGLang's extras (``min_tokens``, ``seed``, ``top_k``,
``stop_token_ids``, ``ignore_eos``) included, with only the cache salt, the completion cap
and the usage options set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.accounts import Plan
from gateway.errors import ApiError
from gateway.router import point
from protocol.fields import CACHE_SALT_FIELDS
from protocol.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    check_depth,
    validate,
)

#: Characters per token assumed when sizing a prompt before a tokenizer has seen it.
_CHARS_PER_TOKEN = 4
#: How much of the conversation's start names it when the client gives no session id.
_SESSION_PREFIX_CHARS = 512


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
    #: no cap was given: ``max_tokens`` is the plan's, and the answer takes what the
    #: model's context leaves below it instead of failing when the prompt is long
    fit_context: bool = False

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
        if self.fit_context:
            body["fit_context"] = True
        if self.stream:
            options = body.get("stream_options") or {}
            body["stream_options"] = {
                **options,
                "include_usage": True,
                "continuous_usage_stats": True,
            }
        return orjson.dumps(body)


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` parsed as a JSON object; :class:`ApiError` 400 saying what is wrong."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    return body


def parse(raw: bytes, *, chat: bool, plan: Plan) -> Inbound:
    """Validate ``raw`` for ``plan``; raises :class:`ApiError` 400 saying what to fix.

    The body is checked with the workers' own schema (:mod:`protocol.openai_requests`), so
    a body admitted here is a body a worker accepts; the plan's limits come on top.
    """
    body = json_object(raw)
    try:
        check_depth(body)
        request = validate(ChatCompletionRequest if chat else CompletionRequest, body)
    except RequestError as exc:
        raise ApiError(exc.status, exc.message, param=exc.param, code=exc.code) from None
    max_tokens = _max_tokens(request, plan, chat=chat)
    if chat:
        text = "".join(_text(message.get("content")) for message in body["messages"])
    else:
        text = _text(body["prompt"])
    estimate = len(text) // _CHARS_PER_TOKEN + 1
    fit_context = chat and request.requested_max_tokens() is None
    if fit_context:  # OpenAI fits an uncapped answer into what the context leaves
        max_tokens = max(min(max_tokens, plan.max_context - estimate), 1)
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
        chat,
        body,
        request.model,
        request.stream,
        request.stream and request.include_usage,
        request.stream and request.continuous_usage,
        max_tokens,
        estimate,
        request.n,
        fit_context,
    )


def _max_tokens(
    request: ChatCompletionRequest | CompletionRequest, plan: Plan, *, chat: bool
) -> int:
    """The completion cap: the client's, checked against the plan, else the default.

    With none given, a text completion gets OpenAI's 16 tokens (the schema's default) and a
    chat completion the plan's most.
    """
    value = request.requested_max_tokens()
    name = "max_completion_tokens" if chat and request.max_completion_tokens else "max_tokens"
    if value is None:
        return plan.max_max_tokens
    if value > plan.max_max_tokens:
        if not chat and "max_tokens" not in request.model_fields_set:
            return plan.max_max_tokens  # the schema's default, not the client's ask
        raise ApiError(
            400,
            f"'{name}' is {value}; your plan allows at most {plan.max_max_tokens}.",
            param=name,
        )
    return value


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
