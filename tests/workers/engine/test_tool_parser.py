"""Reading Hermes-style tool calls out of a reply, whole or as it streams."""

from __future__ import annotations

import json

import pytest

from workers.engine.tool_parser import HermesFormat, ParsedReply, ToolCall, tool_format

FMT = HermesFormat()
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OTHER = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
WEATHER = ToolCall("get_weather", json.dumps({"city": "Paris"}))
TIME = ToolCall("get_time", "{}")


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Just text, <tool_ca no call.", "Just text, <tool_ca no call.", []),
        (CALL, None, [WEATHER]),
        (f"Let me check.\n{CALL}\n{OTHER}", "Let me check.", [WEATHER, TIME]),
        ("<tool_call>not json</tool_call> left", "<tool_call>not json</tool_call> left", []),
        ('<tool_call>\n{"name": "get_time", "arguments": {}}', None, [TIME]),  # ended inside
        ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', None, [ToolCall("f", '{"a": 1}')]),
    ],
)  # fmt: skip
def test_a_whole_reply_splits_into_text_and_calls(
    text: str, content: str | None, calls: list[ToolCall]
) -> None:
    reply = FMT.parse(text)
    assert (reply.content, reply.calls) == (content, calls)


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_streamed_reply_gives_the_same_calls_in_any_pieces(size: int) -> None:
    text = f"Checking <b>now</b>.\n{CALL}\n{OTHER}\n"
    stream = FMT.stream()
    shown, calls = [], []
    for start in range(0, len(text), size):
        piece, done = stream.feed(text[start : start + size])
        shown.append(piece)
        calls += done
    piece, done = stream.finish()
    assert "".join(shown) + piece == "Checking <b>now</b>."  # as whole: FMT.parse(text)
    assert calls + done == [WEATHER, TIME] and stream.calls == 2
    assert FMT.parse(text) == ParsedReply("Checking <b>now</b>.", [WEATHER, TIME])


def test_a_streamed_reply_without_calls_is_its_text_exactly() -> None:
    stream = FMT.stream()
    pieces = [stream.feed(p)[0] for p in ["  Hello", " <tool", "_c", " world", "\n\n"]]
    assert "".join(pieces) + stream.finish()[0] == "  Hello <tool_c world\n\n"


def test_a_block_that_is_no_call_streams_as_text() -> None:
    stream = FMT.stream()
    shown, calls = stream.feed("a <tool_call>oops</tool_call> b")
    assert shown + stream.finish()[0] == "a <tool_call>oops</tool_call> b" and calls == []


def test_the_format_is_read_from_the_template() -> None:
    assert isinstance(tool_format("... <tool_call> ..."), HermesFormat)
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None


def test_the_forced_grammar_names_each_tool() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g"}},
    ]
    named = FMT.structural_tag(tools[:1], "named", parallel=False)
    assert named["format"]["begin"] == '<tool_call>\n{"name": "f", "arguments": '
    required = FMT.structural_tag(tools, "required", parallel=True)["format"]
    assert required["at_least_one"] and not required["stop_after_first"]
    assert [t["content"]["json_schema"] for t in required["tags"]] == [{"type": "object"}] * 2
