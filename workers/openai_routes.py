"""The OpenAI-compatible surface: chat completions, text completions and the model list."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protocol.disconnect import until_disconnect
from protocol.fields import REQUEST_ID_HEADER
from protocol.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    parse_body,
)
from protocol.streaming import DONE, sse
from workers.choices import Tagged, choices, collect_choices, combined_usage
from workers.constraints import ReplyPlan, ReplyPlanner, template_messages
from workers.context import WorkerContext, request_id
from workers.engine.tool_parser import HermesFormat
from workers.generation import TextDelta, Usage
from workers.openai_logprobs import ChoiceLogprobs, TokenPieces
from workers.openai_tools import StreamedToolCalls, whole_message
from workers.streaming import sse_response, started

#: OpenAI object names of the two kinds of completion.
_CHAT, _TEXT = "chat.completion", "text_completion"


def openai_routes(ctx: WorkerContext) -> list[Route]:
    """The routes, bound to ``ctx``."""
    planner = ReplyPlanner(ctx)

    async def chat_completions(request: Request) -> Response:
        body = parse_body(ChatCompletionRequest, await request.body())
        ctx.check_model(body.model)
        plan = await planner.for_chat(body, ctx.chat_template)
        messages = template_messages(body)
        try:
            prompt = ctx.chat_template(messages, **plan.template_vars)
        except ValueError as exc:
            # Templates refuse conversations they cannot render (e.g. role order).
            raise RequestError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from None
        # The template already wrote any BOS the model wants; do not add a second one.
        ids = ctx.tokenizer.encode(prompt, add_special_tokens=False)
        return await _complete(
            ctx, request, body, ids, body.requested_max_tokens(), _CHAT, "messages", plan
        )

    async def completions(request: Request) -> Response:
        body = parse_body(CompletionRequest, await request.body())
        ctx.check_model(body.model)
        plan = await planner.for_completion(body)
        ids = ctx.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else body.prompt
        return await _complete(
            ctx, request, body, ids, body.requested_max_tokens(), _TEXT, "prompt", plan
        )

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": ctx.engine.model_id,
                        "object": "model",
                        "created": 0,
                        "owned_by": "kvgate",
                        "max_model_len": ctx.engine.context_length,
                    }
                ],
            }
        )

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]


async def _complete(
    ctx: WorkerContext,
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    input_ids: list[int],
    max_tokens: int | None,
    kind: str,
    param: str,
    plan: ReplyPlan,
) -> Response:
    """Run one completion, streamed or not; ``kind`` is the OpenAI object name."""
    rid = request_id(request.headers)
    if body.fit_context and max_tokens is not None:  # a cap, not a demand: what is left
        max_tokens = min(max_tokens, max(ctx.engine.context_length - len(input_ids), 1))
    gens = [
        ctx.engine_request(
            rid if i == 0 else f"{rid}-{i}",
            input_ids,
            max_tokens=max_tokens,
            sampling={
                "temperature": body.temperature,
                "top_p": body.top_p,
                "top_k": max(body.top_k, 0),
                # each choice its own draw, all of them reproducible from the one seed
                "seed": None if body.seed is None else (body.seed + i) % 2**63,
                "min_tokens": body.min_tokens,
                "stop_token_ids": tuple(body.stop_token_ids),
                "ignore_eos": body.ignore_eos,
                "logprobs": body.logprobs_k,
                "grammar": plan.grammar,
            },
            cache_salt=body.salt,
            param=param,
        )
        for i in range(body.n)
    ]
    shape = _Shape(
        kind,
        f"{'chatcmpl' if kind == _CHAT else 'cmpl'}-{rid}",
        ctx.engine.model_id,
        None if body.logprobs_k is None else ctx.tokenizer,
        plan.tool_calls,
    )
    headers = {REQUEST_ID_HEADER: rid}

    items = choices(ctx, gens, body.stop_strings)
    if body.stream:
        first_on = await started(request, items)
        if first_on is None:  # the client is gone before the first token
            return Response(status_code=499)
        return sse_response(
            shape.stream(first_on, body.n, body.include_usage, body.continuous_usage), headers
        )
    finals = await until_disconnect(request, lambda: collect_choices(items, body.n))
    if finals is None:  # the client is gone; nobody reads this
        return Response(status_code=499)
    return JSONResponse(shape.whole(finals), headers=headers)


class _Shape:
    """Renders generated text as OpenAI chat or text-completion objects."""

    def __init__(
        self,
        kind: str,
        response_id: str,
        model: str,
        pieces: TokenPieces | None = None,
        tool_calls: HermesFormat | None = None,
    ) -> None:
        self.kind = kind
        self.id = response_id
        self.model = model
        #: names tokens, when the request asked for log-probabilities
        self.pieces = pieces
        #: the format tool calls are read in, when the reply may hold some
        self.tool_calls = tool_calls
        self.created = int(time.time())
        #: the ``object`` of streamed chunks
        self.chunk_object = "chat.completion.chunk" if kind == _CHAT else _TEXT

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def whole(self, finals: list[TextDelta]) -> dict[str, Any]:
        """The non-streaming response: every choice, and the usage of all of them."""
        choices = []
        for index, final in enumerate(finals):
            reason = final.finish_reason
            if self.tool_calls is not None:
                message, reason = whole_message(self.tool_calls, final.text, reason)
                choice: dict[str, Any] = {"message": message}
            elif self.kind == _CHAT:
                choice = {"message": {"role": "assistant", "content": final.text}}
            else:
                choice = {"text": final.text}
            logprobs = (
                self._logprobs().render(final.token_ids, final.logprobs) if self.pieces else None
            )
            choices.append(choice | {"index": index, "logprobs": logprobs, "finish_reason": reason})
        usage = combined_usage([f.usage for f in finals])
        return self._envelope(self.kind, choices) | {"usage": usage.openai()}

    def _logprobs(self) -> ChoiceLogprobs:
        """A renderer of one choice's log-probabilities (only when they were asked)."""
        assert self.pieces is not None
        return ChoiceLogprobs(self.pieces, chat=self.kind == _CHAT)

    def chunk(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One streamed chunk of choice ``index``; ``text`` None is a chat stream's opening
        role chunk."""
        if self.kind == _CHAT:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else {}
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"delta": delta}
        else:
            choice = {"text": text or ""}
        choice |= {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope(self.chunk_object, [choice])

    async def stream(
        self, items: AsyncIterator[Tagged], n: int, include_usage: bool, every_chunk: bool
    ) -> AsyncGenerator[bytes, None]:
        """SSE events of a streamed completion, choices interleaved by index as they come,
        ending with ``data: [DONE]``; with ``every_chunk``, each text chunk carries the usage
        of all choices so far. Asked for, each chunk carries the log-probabilities of the
        tokens since the previous chunk of its choice (text a stop string may still need
        is held back, and so its tokens wait with it)."""
        usage_field = {"usage": None} if include_usage else {}
        latest: list[Usage] = [Usage()] * n
        finished = 0
        renderers = [self._logprobs() for _ in range(n)] if self.pieces else None
        calls = [StreamedToolCalls(self.tool_calls) for _ in range(n)] if self.tool_calls else None
        if self.kind == _CHAT:
            for index in range(n):
                yield sse(self.chunk(index, None, None) | usage_field)
        async with aclosing(items):  # type: ignore[type-var]
            async for index, delta in items:
                latest[index] = delta.usage
                if renderers:
                    renderers[index].add(delta.token_ids, delta.logprobs)
                text, reason, entries = delta.text, delta.finish_reason, None
                if calls:
                    text, entries, reason = calls[index].delta(text, reason)
                if text or entries or reason:
                    so_far = {"usage": combined_usage(latest).openai()}
                    logprobs = renderers[index].take() if renderers else None
                    chunk = self.chunk(index, text, reason, logprobs, entries)
                    yield sse(chunk | (so_far if every_chunk else usage_field))
                finished += delta.finish_reason is not None
                if finished == n and include_usage:
                    usage = {"usage": combined_usage(latest).openai()}
                    yield sse(self._envelope(self.chunk_object, []) | usage)
        yield DONE
