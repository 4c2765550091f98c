"""A Responses request read and translated into the chat completion that serves it.

The chat completion goes through the same validation as a client's own
(:func:`gateway.inbound.parse`: the workers' schema, the plan's caps and context), so
admission, routing, metering and the worker see an ordinary chat request. Its messages are
the ``instructions`` (as a system message), then the stored conversation a
``previous_response_id`` continues, then this turn's ``input``: what a client resending the
whole history would send, token for token. Errors name the Responses fields, not the chat
fields they became.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway import inbound
from gateway.accounts import Plan
from gateway.errors import ApiError
from protocol import responses
from protocol.openai_requests import RequestError
from protocol.responses import ResponseCreateRequest

Message = dict[str, str]

#: chat fields -> the Responses fields they came from (for errors)
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text"}


def read(raw: bytes) -> ResponseCreateRequest:
    """The request in ``raw``; :class:`ApiError` 400 saying what to fix."""
    data = inbound.json_object(raw)
    try:
        return responses.parse(data)
    except RequestError as exc:
        raise ApiError(exc.status, exc.message, param=exc.param, code=exc.code) from None


def turn(request: ResponseCreateRequest) -> list[Message]:
    """This turn's input as chat messages (what is stored for the next turn to replay)."""
    return [{"role": message.role, "content": message.text} for message in request.messages()]


def chat_body(
    request: ResponseCreateRequest, history: list[Message], this_turn: list[Message]
) -> dict[str, Any]:
    """The chat completion body serving ``request`` after ``history``."""
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    body: dict[str, Any] = {
        "model": request.model,
        "messages": system + history + this_turn,
        "stream": request.stream,
    }
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stream:  # the usage ends the stream's response.completed
        body["stream_options"] = {"include_usage": True}
    if request.text is not None and request.text.format is not None:
        response_format = request.text.format.response_format()
        if response_format is not None:
            body["response_format"] = response_format
    # The routing hint: turns sharing one follow one worker (the session key is ``user``).
    routing = request.prompt_cache_key or request.user
    if routing:
        body["user"] = routing
    return body


def admit_shape(
    request: ResponseCreateRequest, body: dict[str, Any], plan: Plan
) -> inbound.Inbound:
    """``body`` validated as a chat completion for ``plan``; errors name Responses fields."""
    cap = request.max_output_tokens
    if cap is not None and cap > plan.max_max_tokens:
        raise ApiError(
            400,
            f"'max_output_tokens' is {cap}; your plan allows at most {plan.max_max_tokens}.",
            param="max_output_tokens",
        )
    try:
        return inbound.parse(orjson.dumps(body), chat=True, plan=plan)
    except ApiError as exc:
        if exc.code == "context_length_exceeded":
            exc.message = (
                "This conversation (instructions, the stored turns of previous_response_id "
                f"and input) with its answer does not fit your plan's context of "
                f"{plan.max_context} tokens. Shorten the input, lower max_output_tokens, or "
                "start a new conversation."
            )
        root = (exc.param or "").split(".")[0]
        if root in _PARAMS:
            exc.param = _PARAMS[root]
        raise
