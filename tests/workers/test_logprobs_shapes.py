"""Naming tokens in OpenAI's log-probability shapes (SmolLM2's byte-level tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.engine.api import TokenLogprobs
from workers.engine.tokenizer import Tokenizer, load_tokenizer
from workers.openai_logprobs import ChoiceLogprobs

TEXT = "héllo — 日本語"


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf: Path) -> Tokenizer:
    return load_tokenizer(smollm2_gguf)


def _entries(ids: list[int], top: tuple[tuple[int, float], ...] = ()) -> list[TokenLogprobs]:
    return [TokenLogprobs(-0.5 - n, top) for n in range(len(ids))]


def test_token_bytes_are_whole_where_a_token_splits_a_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = [tokenizer.token_bytes(i) for i in ids]
    assert b"".join(pieces).decode() == TEXT
    assert any(_is_partial(p) for p in pieces), "no token splits a character: pick other text"


def test_chat_tokens_join_into_the_text_and_special_ones_are_left_out(
    tokenizer: Tokenizer,
) -> None:
    end = tokenizer.eos_token_id
    assert end is not None and tokenizer.is_special(end)
    ids = [*tokenizer.encode(TEXT, add_special_tokens=False), end]
    rendered = ChoiceLogprobs(tokenizer, chat=True).render(ids, _entries(ids, ((end, -1.0),)))
    content = rendered["content"]
    assert len(content) == len(ids) - 1
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == TEXT
    # an alternative may be special: it is named
    assert content[0]["top_logprobs"] == [
        {"token": "<|im_end|>", "logprob": -1.0, "bytes": list(b"<|im_end|>")}
    ]
    partial = [e for e in content if _is_partial(bytes(e["bytes"]))]
    assert partial and all("\ufffd" in e["token"] for e in partial)


def test_text_offsets_run_on_across_streamed_pieces(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    assert len(ids) == 4  # one token a word
    two = ids[1]
    whole = ChoiceLogprobs(tokenizer, chat=False).render(ids, _entries(ids, ((two, -0.1),)))
    assert "".join(whole["tokens"]) == "one two three four"
    assert whole["text_offset"] == [0, 3, 7, 13]
    # the generated token is always among the alternatives: k + 1 of them at most
    assert [len(top) for top in whole["top_logprobs"]] == [2, 1, 2, 2]
    assert whole["top_logprobs"][1] == {" two": -0.1}

    streamed = ChoiceLogprobs(tokenizer, chat=False)
    parts = []
    for n, token in enumerate(ids):
        streamed.add([token], _entries(ids, ((two, -0.1),))[n : n + 1])
        parts.append(streamed.take())
    assert [o for p in parts for o in p["text_offset"]] == whole["text_offset"]


def _is_partial(piece: bytes) -> bool:
    try:
        piece.decode()
    except UnicodeDecodeError:
        return True
    return False
