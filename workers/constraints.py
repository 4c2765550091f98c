"""What a request asks its reply to be, in the engine's terms: ``response_format`` and
``tools`` become the grammar decoding follows, the template's tool variables, and the format
tool calls are read back in.

Everything a client can get wrong here is a 400 before the request reaches the engine:
tools for a model whose chat template takes none, a call format the engine cannot read, a
schema that does not compile. Grammars are compiled on a worker thread (a large schema
takes a while; the event loop must not wait), over the model's vocabulary, which is read
once, at the first structured request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.openai_requests import ChatCompletionRequest, CompletionRequest, RequestError
from protocol.structured import NamedToolChoice, ResponseFormat
from workers.context import ChatTemplate, WorkerContext
from workers.engine.grammar import Grammar, GrammarError, Grammars
from workers.engine.tool_parser import HermesFormat, tool_format


@dataclass(frozen=True)
class ReplyPlan:
    """How one request's reply is made and read."""

    #: what decoding follows; None: anything
    grammar: Grammar | None = None
    #: variables for the chat template (``tools``)
    template_vars: dict[str, Any] = field(default_factory=dict)
    #: the format tool calls are read back in; None: the reply is text only
    tool_calls: HermesFormat | None = None


class ReplyPlanner:
    """Plans replies for one worker's model (its grammars are compiled lazily, once)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._grammars: Grammars | None = None
        self._lock = threading.Lock()

    async def for_chat(self, body: ChatCompletionRequest, template: ChatTemplate) -> ReplyPlan:
        """The plan of a chat completion; :class:`RequestError` when it cannot be served."""
        _check_tool_turns(body, template)
        wanted = _wanted_format(body.response_format)
        if not body.calls_allowed:
            return ReplyPlan(await self._format_grammar(body.response_format) if wanted else None)
        fmt = tool_format(template.source)
        if not template.takes_tools:
            raise RequestError(
                "this model's chat template takes no tool definitions, so the model cannot "
                "call tools; remove 'tools' (or send 'tool_choice': 'none')",
                param="tools",
            )
        if fmt is None:
            raise RequestError(
                "this model writes tool calls in a format the built-in engine does not read "
                "(it reads <tool_call> blocks, as Qwen and Hermes models write them); remove 'tools'",
                param="tools",
            )
        if wanted:
            raise RequestError(
                "send either 'tools' or a JSON 'response_format', not both: a reply cannot be "
                "held to a schema and call tools",
                param="response_format",
            )
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        plan_vars = {"tools": tools}
        choice = body.tool_choice
        if choice is None or choice == "auto":
            return ReplyPlan(None, plan_vars, fmt)
        if isinstance(choice, NamedToolChoice):
            tag = fmt.structural_tag(
                [t for t in tools if t["function"]["name"] == choice.function.name],
                "named",
                parallel=False,
            )
        else:
            tag = fmt.structural_tag(
                tools, "required", parallel=body.parallel_tool_calls is not False
            )
        grammar = await self._compile(lambda g: g.structural_tag(tag, "tool calls"), "tools")
        return ReplyPlan(grammar, plan_vars, fmt)

    async def for_completion(self, body: CompletionRequest) -> ReplyPlan:
        """The plan of a text completion (a ``response_format`` is all it may carry)."""
        if not _wanted_format(body.response_format):
            return ReplyPlan()
        return ReplyPlan(await self._format_grammar(body.response_format))

    async def _format_grammar(self, fmt: ResponseFormat | None) -> Grammar:
        spec = fmt.json_schema if fmt is not None else None
        schema = spec.schema_ if spec is not None else None
        return await self._compile(lambda g: g.json_schema(schema), "response_format")

    async def _compile(self, build: Callable[[Grammars], Grammar], param: str) -> Grammar:
        """``build(grammars)`` on a worker thread; a schema that does not compile is a 400."""
        try:
            return await asyncio.to_thread(lambda: build(self._model_grammars()))
        except GrammarError as exc:
            raise RequestError(
                f"{param}: the schema cannot be followed: {exc}", param=param
            ) from None

    def _model_grammars(self) -> Grammars:
        with self._lock:
            if self._grammars is None:
                ctx = self._ctx
                self._grammars = Grammars.for_tokenizer(
                    ctx.tokenizer.backend,
                    vocab_size=ctx.engine.vocab_size,
                    stop_token_ids=ctx.engine.eos_token_ids,
                )
            return self._grammars


def _wanted_format(fmt: ResponseFormat | None) -> bool:
    """Whether ``response_format`` asks for JSON (``text`` asks for nothing)."""
    return fmt is not None and fmt.type != "text"


def _check_tool_turns(body: ChatCompletionRequest, template: ChatTemplate) -> None:
    """A 400 for tool results or earlier calls in the history of a model without tools."""
    if template.takes_tools:
        return
    if any(m.role == "tool" or m.tool_calls for m in body.messages):
        raise RequestError(
            "this model's chat template takes no tool results ('tool' messages) or tool "
            "calls: it has no place for them; the model cannot use tools",
            param="messages",
        )


def template_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as the chat template reads them: an earlier call's arguments as an
    object (templates write them with ``tojson``), not the JSON text OpenAI sends."""
    out = []
    for index, message in enumerate(body.messages):
        item = message.model_dump(exclude_none=True)
        for call in item.get("tool_calls", []):
            try:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            except ValueError:
                raise RequestError(
                    "a tool call's arguments must be JSON text",
                    param=f"messages.{index}.tool_calls",
                ) from None
        out.append(item)
    return out
