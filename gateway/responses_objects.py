"""The objects the Responses API answers with, built from a chat completion's parts.

One :class:`Draft` per request holds what is known before the worker answers (ids, the
request's settings); :meth:`Draft.response` renders the ``response`` object at any stage
(in progress, completed, incomplete, failed), so the whole answer and every streamed event
carry the same fields. Shapes follow the ``openai`` SDK's ``Response`` type; usage keeps
kvgate's ``cached_tokens_by_tier`` beside OpenAI's ``cached_tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from protocol.responses import ResponseCreateRequest

#: chat ``finish_reason`` -> (Responses ``status``, ``incomplete_details.reason``)
FINISH = {
    "stop": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


@dataclass
class Draft:
    """One response on its way: its ids and settings, and what the worker has said so far."""

    id: str
    message_id: str
    request: ResponseCreateRequest
    #: stored for chaining (false when the client said so, or when storing failed)
    store: bool
    created_at: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    #: when the worker's answer was complete (set by :meth:`complete`)
    completed_at: int | None = None

    def complete(self) -> None:
        """Note that the worker's answer is all here (once: the stored and the answered
        object carry the same time)."""
        if self.completed_at is None:
            self.completed_at = int(time.time())

    @property
    def status(self) -> str:
        """The response's status once the worker finished (``failed`` for an abort)."""
        return FINISH.get(self.finish_reason or "", ("failed", None))[0]

    def message(self, *, done: bool) -> dict[str, Any]:
        """The output message item (``in_progress`` until ``done``)."""
        status = "in_progress" if not done else self.status
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": "incomplete" if status == "failed" else status,
            "content": [self.part()] if done else [],
        }

    def part(self, text: str | None = None) -> dict[str, Any]:
        """The output text part (``text`` while it grows, else all of it)."""
        return {
            "type": "output_text",
            "text": self.text if text is None else text,
            "annotations": [],
            "logprobs": [],
        }

    def response(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``response`` object with ``status``: no output while in progress, else the
        message, the usage and (when incomplete) why."""
        req = self.request
        finished = status not in ("in_progress", "queued")
        reason = FINISH.get(self.finish_reason or "", (None, None))[1]
        text_format = req.text.format if req.text is not None else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at if status == "completed" else None,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": req.model,
            "output": [self.message(done=True)] if finished and self.has_output(status) else [],
            "parallel_tool_calls": False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": self.store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {
                "format": (
                    {"type": "text"}
                    if text_format is None
                    else text_format.model_dump(by_alias=True, exclude_none=True)
                )
            },
            "tool_choice": "none",
            "tools": [],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "usage": usage(self.usage) if finished and self.usage is not None else None,
            "user": req.user,
            "metadata": req.metadata or {},
        }

    def has_output(self, status: str) -> bool:
        """Whether a finished response shows its message (a failed one only if it has text)."""
        return status != "failed" or bool(self.text)

    def final(self) -> dict[str, Any]:
        """The finished ``response`` object (status from the worker's finish reason)."""
        status = self.status
        error = None
        if status == "failed":
            error = {
                "code": "server_error",
                "message": "The worker aborted the generation; retry the request.",
            }
        return self.response(status, error)


def usage(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion's ``usage`` as the Responses API names it."""
    details = chat.get("prompt_tokens_details") or {}
    prompt, completion = (
        int(chat.get("prompt_tokens") or 0),
        int(chat.get("completion_tokens") or 0),
    )
    input_details: dict[str, Any] = {
        "cached_tokens": int(details.get("cached_tokens") or 0),
        "cache_write_tokens": 0,
    }
    if isinstance(details.get("cached_tokens_by_tier"), dict):
        input_details["cached_tokens_by_tier"] = details["cached_tokens_by_tier"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": input_details,
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }
