"""Tool calls in OpenAI's shapes: a chat choice's ``message.tool_calls``, and the
``delta.tool_calls`` of a stream, read from the reply by the engine's tool parser.

A streamed call comes whole in one delta (its id, name and all its arguments), as soon as
its block closes; OpenAI's clients accept arguments in one piece as in many. A choice that
called a tool and ended by itself finishes with ``tool_calls``.
"""

from __future__ import annotations

import uuid
from typing import Any

from workers.engine.tool_parser import HermesFormat, ToolCall


def _openai(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    shaped: dict[str, Any] = {} if index is None else {"index": index}
    return shaped | {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _finish(reason: str | None, called: bool) -> str | None:
    """``tool_calls`` for a reply with calls that ended by itself; else ``reason``."""
    return "tool_calls" if called and reason == "stop" else reason


def whole_message(
    fmt: HermesFormat, text: str, reason: str | None
) -> tuple[dict[str, Any], str | None]:
    """A finished reply as a chat ``message`` with its calls, and its finish reason."""
    reply = fmt.parse(text)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.calls:
        message["tool_calls"] = [_openai(call) for call in reply.calls]
    return message, _finish(reason, bool(reply.calls))


class StreamedToolCalls:
    """One streamed choice's text, split into what to show and the calls, delta by delta."""

    def __init__(self, fmt: HermesFormat) -> None:
        self._stream = fmt.stream()

    def delta(self, text: str, reason: str | None) -> tuple[str, list[dict[str, Any]], str | None]:
        """The text to show, the calls completed (OpenAI delta entries) and the finish reason
        for the next piece of the reply (``reason`` set: the last)."""
        shown, calls = self._stream.feed(text)
        if reason is not None:
            tail, last = self._stream.finish()
            shown, calls = shown + tail, calls + last
        first = self._stream.calls - len(calls)
        entries = [_openai(call, first + k) for k, call in enumerate(calls)]
        return shown, entries, _finish(reason, self._stream.calls > 0)
