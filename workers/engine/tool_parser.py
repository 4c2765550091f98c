"""Tool calls in a model's reply: the format a model writes them in, finding them in its text
(whole or as it streams), and the grammar that makes a reply nothing but calls.

A model trained for tools writes calls in its own markup, and its chat template shows which
(the template renders earlier calls the way the model writes them). The one format known
here is Hermes's, which Qwen 2.5 and 3, Hermes and many fine-tunes share (SGLang's and
vLLM's ``hermes``/``qwen25`` parsers)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A block whose body is not such a JSON object is left in the text, as the model wrote it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workers.engine.grammar import MAX_WHITESPACE

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
#: a whole call block, or a last one the reply ended inside
_BLOCK = re.compile(re.escape(_OPEN) + r"(.*?)(?:" + re.escape(_CLOSE) + r"|\Z)", re.DOTALL)

#: how a forced reply is made of calls: exactly the named one, or one or more of any
ForcedCalls = Literal["named", "required"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into its text (None when only calls remain) and its calls."""

    content: str | None
    calls: list[ToolCall]


def _call(body: str) -> ToolCall | None:
    """The call a block's body holds, or None when it holds none."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    return ToolCall(
        data["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)
    )


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks."""

    name = "hermes"

    def parse(self, text: str) -> ParsedReply:
        """``text`` as the text around its calls and the calls; a reply without calls is
        its text unchanged."""
        calls: list[ToolCall] = []
        kept: list[str] = []
        end = 0
        for match in _BLOCK.finditer(text):
            call = _call(match.group(1))
            if call is None:
                continue
            kept.append(text[end : match.start()])
            end = match.end()
            calls.append(call)
        if not calls:
            return ParsedReply(text, [])
        content = ("".join(kept) + text[end:]).rstrip()
        return ParsedReply(content or None, calls)

    def stream(self) -> ToolCallStream:
        """A parser for one reply that arrives in pieces."""
        return ToolCallStream(self)

    def structural_tag(
        self, tools: Sequence[Mapping[str, Any]], forced: ForcedCalls, *, parallel: bool
    ) -> dict[str, Any]:
        """An xgrammar structural tag for a reply of calls only: the one tool in ``tools``
        (``named``), or one or more of them, one per line (``required``; just one unless
        ``parallel``). Arguments follow each function's ``parameters`` schema."""
        tags = [
            {
                "type": "tag",
                "begin": f'{_OPEN}\n{{"name": {json.dumps(t["function"]["name"])}, "arguments": ',
                "content": {
                    "type": "json_schema",
                    "json_schema": t["function"].get("parameters") or {"type": "object"},
                    "max_whitespace_cnt": MAX_WHITESPACE,
                },
                "end": f"}}\n{_CLOSE}",
            }
            for t in tools
        ]
        if forced == "named":
            return {"type": "structural_tag", "format": tags[0]}
        return {
            "type": "structural_tag",
            "format": {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": "\n",
                "at_least_one": True,
                "stop_after_first": not parallel,
            },
        }


class ToolCallStream:
    """Splits a streamed reply into text and calls as its pieces come.

    Text that may be the start of a call block is held back until it is clear; a call is
    reported whole once its block closes. Trailing whitespace is held back too, until text
    follows it: what separates calls is not text to show (:meth:`HermesFormat.parse` drops
    it as well). :meth:`finish` releases what is left (a last block the reply ended inside
    counts if its body is a whole call).
    """

    def __init__(self, fmt: HermesFormat) -> None:
        self._format = fmt
        self._pending = ""
        self._in_block = False
        self._space = ""
        #: calls reported so far
        self.calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """Take the next piece; the text now safe to show, and the calls completed."""
        self._pending += text
        shown: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._in_block:
                end = self._pending.find(_CLOSE)
                if end < 0:
                    break
                body = self._pending[:end]
                self._pending = self._pending[end + len(_CLOSE) :]
                self._in_block = False
                self._close(body, shown, calls, closed=True)
                continue
            start = self._pending.find(_OPEN)
            if start < 0:
                keep = _partial_suffix(self._pending, _OPEN)
                shown.append(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                break
            shown.append(self._pending[:start])
            self._pending = self._pending[start + len(_OPEN) :]
            self._in_block = True
        return self._show("".join(shown)), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the reply: the text still held back, and a last unclosed call."""
        shown: list[str] = []
        calls: list[ToolCall] = []
        if self._in_block:
            self._close(self._pending, shown, calls, closed=False)
        else:
            shown.append(self._pending)
        self._pending, self._in_block = "", False
        text = self._show("".join(shown))
        if not self.calls:  # a reply without calls is its text, every space of it
            text, self._space = text + self._space, ""
        return text, calls

    def _show(self, text: str) -> str:
        """``text`` behind the whitespace held back, less its own trailing whitespace (held
        back in turn)."""
        text = self._space + text
        shown = text.rstrip()
        self._space = text[len(shown) :]
        return shown

    def _close(self, body: str, shown: list[str], calls: list[ToolCall], *, closed: bool) -> None:
        call = _call(body)
        if call is None:  # not a call after all: the block is text
            shown.append(_OPEN + body + (_CLOSE if closed else ""))
            return
        calls.append(call)
        self.calls += 1


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that ``marker`` starts with."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


#: the formats known, by a phrase their templates write
_FORMATS = {_OPEN: HermesFormat()}


def tool_format(template_source: str) -> HermesFormat | None:
    """The format of tool calls a chat template renders, or None when it is not known."""
    for marker, fmt in _FORMATS.items():
        if marker in template_source:
            return fmt
    return None
