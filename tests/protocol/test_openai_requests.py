"""Request bodies: what the one schema accepts, and what it says of a body it refuses."""

from __future__ import annotations

import json

import pytest

from protocol.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    parse_body,
)

USER = {"role": "user", "content": "hi"}


def chat(**fields: object) -> bytes:
    return json.dumps({"model": "m", "messages": [USER], **fields}).encode()


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b"{", None, "not valid JSON"),
        (b"[1]", None, "JSON object"),
        (chat(messages=[]), "messages", "at least 1"),
        (chat(messages="hi"), "messages", "valid list"),
        (chat(messages=[{"content": "x"}]), "messages.0.role", "required"),
        (chat(messages=[{"role": "bot", "content": "x"}]), "messages.0.role", "unknown role 'bot'"),
        (chat(messages=[{"role": "user"}]), "messages.0", "needs 'content'"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages.0.content",
            "text content",
        ),
        (chat(max_tokens=-1), "max_tokens", "greater than or equal to 1"),
        (chat(max_tokens=10**12), "max_tokens", "less than or equal"),
        (chat(n=9), "n", "less than or equal to 8"),
        (chat(n=0), "n", "greater than or equal to 1"),
        (chat(top_logprobs=2), "top_logprobs", "only taken with 'logprobs': true"),
        (chat(logprobs=False, top_logprobs=0), "top_logprobs", "only taken with"),
        (chat(logprobs=True, top_logprobs=21), "top_logprobs", "less than or equal to 20"),
        (chat(logprobs=1), "logprobs", "valid boolean"),
        (chat(temperature=5), "temperature", "less than or equal to 2"),
        (chat(stop=[""]), "stop", "non-empty"),
        (chat(seed=2**64), "seed", "does not fit in 64 bits"),
        (chat(seed=-(2**63) - 1), "seed", "does not fit in 64 bits"),
        (json.dumps({"messages": [USER]}).encode(), "model", "required"),
    ],
)
def test_bad_chat_bodies_say_what_to_fix(body: bytes, param: str | None, words: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_body(ChatCompletionRequest, body)
    assert err.value.param == param
    assert words in err.value.message
    assert err.value.status == 400


def test_chat_body_parses_openai_and_sglang_fields() -> None:
    body = parse_body(
        ChatCompletionRequest,
        chat(
            messages=[
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                USER,
            ],
            max_tokens=5,
            max_completion_tokens=7,
            stop="x",
            stream=True,
            stream_options={"include_usage": True},
            top_k=-1,
            extra_key="tenant",
            ignore_eos=True,
            response_format={"type": "text"},  # unknown fields are ignored
        ),
    )
    assert body.messages[0].content == "ab"
    assert body.requested_max_tokens() == 7
    assert body.stop_strings == ["x"]
    assert body.include_usage and body.salt == "tenant" and body.ignore_eos


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hello", "hello"), ([1, 2], [1, 2]), (["hello"], "hello"), ([[3, 4]], [3, 4])],
)
def test_completion_prompt_forms(prompt: object, expected: object) -> None:
    body = parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": prompt}).encode())
    assert body.prompt == expected
    assert body.requested_max_tokens() == 16


@pytest.mark.parametrize(
    ("prompt", "words"), [("", "empty"), (["a", "b"], "only one prompt"), ([1, -2], ">= 0")]
)
def test_bad_completion_prompts(prompt: object, words: str) -> None:
    with pytest.raises(RequestError, match=words):
        parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": prompt}).encode())


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        ({"ignore_eos": "false"}, "ignore_eos"),
        ({"n": True}, "n"),
        ({"max_tokens": True}, "max_tokens"),
    ],
)
def test_booleans_and_counts_are_what_json_says_they_are(fields: dict, param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_body(ChatCompletionRequest, chat(**fields))
    assert err.value.param == param
