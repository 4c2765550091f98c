"""Text <-> token ids for the built-in engine, from a GGUF file or a ``tokenizer.json``.

A GGUF file carries a byte-level BPE vocabulary (``tokenizer.ggml.tokens``), its merges,
token types and the name of llama.cpp's pre-tokenizer (``tokenizer.ggml.pre``); from these
we build the same ``tokenizers`` pipeline as the model's original ``tokenizer.json`` (for
SmolLM2: single digits split off, then GPT-2's byte-level regex). The result can be saved
as Hugging Face tokenizer files (``save_pretrained``) that ``transformers`` loads as is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from workers.engine.chat_template import ChatTemplate, ChatTemplateError
from workers.engine.gguf_metadata import GGUFMetadata

#: llama.cpp token types (``tokenizer.ggml.token_type``) that we treat specially.
_CONTROL, _USER_DEFINED = 3, 4

#: The regex llama.cpp uses for Llama 3 style tokenizers ("llama-bpe").
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _llama3() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


#: ``tokenizer.ggml.pre`` -> the Hugging Face pre-tokenizer with llama.cpp's regexes for it.
#: smollm, starcoder and friends: "\p{N}" (each digit alone), then the GPT-2 regex.
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "gpt2": _gpt2,
    "default": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "codeshell": _digits_then_gpt2,
    "llama-bpe": _llama3,
}


@dataclass(frozen=True)
class SpecialTokens:
    """The named special tokens (as strings) and whether encoding prepends BOS."""

    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    unk: str | None = None
    add_bos: bool = False
    #: every control token (``<|im_start|>``, ...), named ones included
    all: tuple[str, ...] = field(default_factory=tuple)


class Tokenizer:
    """A byte-level BPE tokenizer plus what serving needs: special ids and the chat template."""

    def __init__(
        self, backend: HFTokenizer, special: SpecialTokens, chat_template: str | None = None
    ) -> None:
        self.backend = backend
        self.special = special
        self.chat_template = chat_template
        self._compiled_template: ChatTemplate | None = None

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Build from GGUF metadata (``tokenizer.ggml.*`` and ``tokenizer.chat_template``)."""
        meta = GGUFMetadata.open(path)
        kind = meta.require("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"{meta.path}: tokenizer model {kind!r} is not supported; need byte-level BPE ('gpt2')"
            )
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"{meta.path}: pre-tokenizer {pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}"
            )
        tokens: list[str] = meta.require("tokenizer.ggml.tokens")
        types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in meta.require("tokenizer.ggml.merges")]
        backend = HFTokenizer(
            models.BPE(
                vocab={tok: i for i, tok in enumerate(tokens)},
                merges=merges,
                fuse_unk=False,
                byte_fallback=False,
            )
        )
        backend.pre_tokenizer = PRE_TOKENIZERS[pre]()
        backend.decoder = decoders.ByteLevel()
        # Control tokens are special (never split, skipped on decode); user-defined ones are
        # added tokens that still decode as text. Ids are preserved: they are in the vocab.
        backend.add_tokens(
            [
                AddedToken(tok, special=t == _CONTROL, normalized=False)
                for tok, t in zip(tokens, types, strict=True)
                if t in (_CONTROL, _USER_DEFINED)
            ]
        )

        def name(key: str) -> str | None:
            idx = meta.get(f"tokenizer.ggml.{key}_token_id")
            return None if idx is None else tokens[int(idx)]

        special = SpecialTokens(
            bos=name("bos"),
            eos=name("eos"),
            pad=name("padding"),
            unk=name("unknown"),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            all=tuple(tok for tok, t in zip(tokens, types, strict=True) if t == _CONTROL),
        )
        if special.add_bos and special.bos is not None:
            bos_id = tokens.index(special.bos)
            backend.post_processor = processors.TemplateProcessing(
                single=f"{special.bos} $A",
                pair=f"{special.bos} $A $B",
                special_tokens=[(special.bos, bos_id)],
            )
        return cls(backend, special, meta.get("tokenizer.chat_template"))

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` (+ ``tokenizer_config.json``) from a Hugging Face directory."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{path}: no tokenizer.json (a fast Hugging Face tokenizer is needed)"
            )
        backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
        config_path = path / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}

        def name(key: str) -> str | None:
            value = config.get(f"{key}_token")
            return value.get("content") if isinstance(value, dict) else value

        special = SpecialTokens(
            bos=name("bos"),
            eos=name("eos"),
            pad=name("pad"),
            unk=name("unk"),
            add_bos=bool(config.get("add_bos_token", False)),
            all=tuple(t.content for t in backend.get_added_tokens_decoder().values() if t.special),
        )
        template = config.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        return cls(backend, special, template)

    # --- use ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str | None) -> int | None:
        """Id of a token string (e.g. ``<|im_end|>``), or None when absent."""
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id(self.special.bos)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.special.eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token strings in it (``<|im_start|>``) become their ids.

        ``add_special_tokens`` adds BOS when the model wants it (SmolLM2 does not).
        """
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens are dropped unless ``skip_special_tokens`` is False."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for OpenAI-style ``messages`` through the model's chat template.

        Raises ``ChatTemplateError`` (a ``ValueError``) when the model has no template or the
        template rejects the conversation; the message is fit for a 400 response.
        """
        if self._compiled_template is None:
            if self.chat_template is None:
                raise ChatTemplateError("this model has no chat template; use /v1/completions")
            self._compiled_template = ChatTemplate(
                self.chat_template, bos_token=self.special.bos, eos_token=self.special.eos
            )
        return self._compiled_template.render(
            messages, add_generation_prompt=add_generation_prompt, **extra
        )

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for (a special token's: its name), whole even where
        the token holds part of a character, which decoding it alone would replace."""
        token = self.backend.id_to_token(token_id)
        if token is None:
            raise ValueError(f"{token_id} is not a token id of this tokenizer")
        if token_id in self._added_ids or not all(c in _BYTE_OF_CHAR for c in token):
            return self.decode([token_id], skip_special_tokens=False).encode()
        return bytes(_BYTE_OF_CHAR[c] for c in token)

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special token, which decoded text leaves out."""
        return token_id in self._special_ids

    @functools.cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self.backend.get_added_tokens_decoder())

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        added = self.backend.get_added_tokens_decoder()
        return frozenset(i for i, t in added.items() if t.special)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer for one generated sequence."""
        return IncrementalDetokenizer(self, skip_special_tokens)

    def save_pretrained(self, directory: str | Path) -> list[Path]:
        """Write Hugging Face tokenizer files that ``AutoTokenizer.from_pretrained`` loads."""
        # import cycle: the export reads a Tokenizer; loaded only when one is exported
        from workers.engine.tokenizer_export import save_pretrained

        return save_pretrained(self, Path(directory))


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, which byte-level BPE vocabularies are written in: the
    character standing for each byte (printable bytes stand for themselves, the others for
    the characters from U+0100 on, in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(shifted)}


_BYTE_OF_CHAR = _byte_level_alphabet()


class IncrementalDetokenizer:
    """Turns a growing list of generated ids into text deltas for streaming.

    Byte-level BPE can split one character over several tokens; decoding such a prefix
    yields U+FFFD. We hold text back until the character is complete, and decode only a
    short window of recent tokens each time (a token's text depends only on its bytes), so
    a step costs O(1) rather than O(sequence).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        #: all text emitted so far (what stop-string matching should look at)
        self.text = ""
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this are already emitted

    def push(self, new_ids: Sequence[int]) -> str:
        """Append ``new_ids`` and return the newly completed text (maybe empty)."""
        self.ids.extend(new_ids)
        decode = self._tok.decode
        before = decode(self.ids[self._prefix : self._read], self._skip)
        after = decode(self.ids[self._prefix :], self._skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing new, or a character still incomplete
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of the sequence: whatever is still held back (incomplete bytes as U+FFFD)."""
        before = self._tok.decode(self.ids[self._prefix : self._read], self._skip)
        after = self._tok.decode(self.ids[self._prefix :], self._skip)
        delta = after[len(before) :]
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta


def load_tokenizer(source: str | Path) -> Tokenizer:
    """The tokenizer of a ``.gguf`` file or of a Hugging Face model directory.

    ``tiny-random`` has no tokenizer of its own: callers pass the SmolLM2 GGUF for it (its
    vocabulary and special ids match ``TINY_CONFIG``).
    """
    path = Path(source)
    if path.is_dir():
        return Tokenizer.from_dir(path)
    if path.is_file() and path.suffix == ".gguf":
        return Tokenizer.from_gguf(path)
    raise FileNotFoundError(
        f"tokenizer source {str(source)!r}: not a .gguf file or a model directory"
    )
