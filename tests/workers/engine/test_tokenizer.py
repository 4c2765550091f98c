"""SmolLM2's tokenizer built from its GGUF: encode/decode, streaming detokenization, export.

References: transformers' own GGUF tokenizer conversion (built independently from the same
vocabulary and merges) and ``AutoTokenizer`` loading the files we export.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from kvgate.cli import cli
from workers.engine.tokenizer import Tokenizer, load_tokenizer

SAMPLES = [
    "Hello, world!",
    "The quick brown fox   jumps\t\tover\n\n\nthe lazy dog.",
    "I'm sure you're right; it'll be fine, won't it?",
    "Prices: 3.14159, 1,000,000 and 2024-11-29T22:40Z.",
    "café naïve façade — «quotes» “curly” ½ ∑ ≠ ∞",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 zwj",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2, {"nested": null}], "s": "a\\"b"}',
    "    leading spaces and trailing   ",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "text<|im_end|>glued<|endoftext|> <file_sep>x",
]


@pytest.fixture(scope="module")
def tok(smollm2_gguf: Path) -> Tokenizer:
    return load_tokenizer(smollm2_gguf)


def test_special_tokens_and_ids(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.special.unk == "<|endoftext|>" and tok.special.pad == "<|im_end|>"
    assert not tok.special.add_bos  # SmolLM2 prompts start without BOS
    assert tok.encode("<|im_start|>user\n") == [1, 4093, 198]
    # Special-token strings are never split, even glued to text.
    assert tok.encode("a<|im_end|>b")[1] == 2


def test_digits_are_split_one_by_one(tok: Tokenizer) -> None:
    # llama.cpp's "smollm" pre-tokenizer: \p{N} first, then GPT-2's regex.
    ids = tok.encode("year 2024")
    assert [tok.decode([i]) for i in ids[-4:]] == ["2", "0", "2", "4"]


def test_matches_transformers_own_gguf_tokenizer(smollm2_gguf: Path, tok: Tokenizer) -> None:
    """Same vocabulary, merges and specials; transformers ignores ``tokenizer.ggml.pre``.

    It therefore lacks SmolLM2's digit split, which changes nothing for ASCII digits (the
    vocabulary has no multi-digit tokens) but does for other numerals: " ½" is one token to
    it and " ", "½" to us, as to llama.cpp and SmolLM2's own tokenizer.json.
    """
    reference = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    for text in SAMPLES:
        expected = reference.encode(text, add_special_tokens=False)
        if text.isascii():
            assert tok.encode(text) == expected, text
        else:
            words = text.split(" ")
            plain = " ".join(w for w in words if not any(c.isnumeric() for c in w))
            assert tok.encode(plain) == reference.encode(plain, add_special_tokens=False), plain
    assert tok.encode(" ½") == [216, reference.encode("½", add_special_tokens=False)[0]]


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_round_trips(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    stripped = text
    for special in tok.special.all:
        stripped = stripped.replace(special, "")
    assert tok.decode(ids) == stripped


def test_incremental_detokenizer_never_splits_characters(tok: Tokenizer) -> None:
    text = "".join(SAMPLES)
    ids = tok.encode(text)
    detok = tok.detokenizer()
    deltas = [detok.push([i]) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids) == detok.text
    assert not any("\ufffd" in d for d in deltas)
    # A character spread over several tokens arrives whole, in one delta.
    emoji_ids = tok.encode("😀")  # one code point, four UTF-8 bytes
    assert len(emoji_ids) > 1
    detok = tok.detokenizer()
    assert [detok.push([i]) for i in emoji_ids] == [""] * (len(emoji_ids) - 1) + ["😀"]


def test_incremental_detokenizer_in_chunks_and_with_specials(tok: Tokenizer) -> None:
    ids = tok.encode(SAMPLES[10] + SAMPLES[6])
    for keep in (True, False):
        detok = tok.detokenizer(skip_special_tokens=not keep)
        out = "".join(detok.push(ids[i : i + 3]) for i in range(0, len(ids), 3)) + detok.flush()
        assert out == tok.decode(ids, skip_special_tokens=not keep)


def test_flush_releases_an_incomplete_character(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    detok = tok.detokenizer()
    assert detok.push(ids[:-1]) == ""  # held back: only part of the emoji's bytes
    assert detok.flush() == "\ufffd" * len(tok.decode(ids[:-1]))


def test_export_loads_in_transformers_and_tokenizes_identically(
    tok: Tokenizer, smollm2_gguf: Path, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli, ["models", "export-tokenizer", str(smollm2_gguf), str(tmp_path / "tok")]
    )
    assert result.exit_code == 0, result.output
    names = {p.name for p in (tmp_path / "tok").iterdir()}
    assert names == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}

    hf = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert set(hf.all_special_tokens) >= set(tok.special.all)
    for text in SAMPLES:
        ids = tok.encode(text)
        assert hf.encode(text) == ids, text
        assert hf.decode(ids) == tok.decode(ids, skip_special_tokens=False)
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)

    conversation = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And times 3? ½ 😀"},
    ]
    for gen in (True, False):
        assert hf.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=gen
        ) == tok.render_chat(conversation, add_generation_prompt=gen)

    # Our loader reads the exported directory back to the same tokenizer.
    again = load_tokenizer(tmp_path / "tok")
    assert again.special == tok.special and again.chat_template == tok.chat_template
    assert all(again.encode(t) == tok.encode(t) for t in SAMPLES)


def test_unsupported_sources_say_what_is_needed(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="gguf"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        load_tokenizer(tmp_path)
