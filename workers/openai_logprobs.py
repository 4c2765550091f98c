"""Log-probabilities in OpenAI's shapes: a chat completion's ``logprobs.content`` and a text
completion's ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``.

The values are the engine's (:mod:`workers.engine.logprobs`: the model's own distribution,
before temperature and cuts). Each token is named by its text and, for chat, its exact
UTF-8 bytes: a token holding part of a character has U+FFFD in its text, and the bytes of
consecutive tokens join into the character. Special tokens (an end-of-turn marker), which
the completion's text leaves out, are left out here too, so that the tokens join into the
text; they still appear among the alternatives, where they were likely. A stop string cuts
the text but not the tokens: the one that completed it is reported, as generated (and
counted in ``completion_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from workers.engine.api import TokenLogprobs


class TokenPieces(Protocol):
    """What naming a token takes (the worker's tokenizer)."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for."""
        ...

    def is_special(self, token_id: int) -> bool:
        """Whether a token is special, which decoded text leaves out."""
        ...


class ChoiceLogprobs:
    """One choice's log-probabilities, rendered piece by piece as its tokens arrive (a text
    completion's ``text_offset`` runs on from one piece to the next)."""

    def __init__(self, tokenizer: TokenPieces, *, chat: bool) -> None:
        self._tokenizer = tokenizer
        self._chat = chat
        #: characters of the tokens rendered so far (a text completion's next offset)
        self._offset = 0
        self._pending: list[tuple[int, TokenLogprobs]] = []

    def add(self, token_ids: Sequence[int], entries: Sequence[TokenLogprobs]) -> None:
        """Hold the tokens of a streamed delta until :meth:`take` renders them."""
        self._pending.extend(zip(token_ids, entries, strict=True))

    def take(self) -> dict[str, Any]:
        """The ``logprobs`` of a streamed chunk: the tokens added since the last one."""
        pending, self._pending = self._pending, []
        return self._shape(pending)

    def render(self, token_ids: Sequence[int], entries: Sequence[TokenLogprobs]) -> dict[str, Any]:
        """The ``logprobs`` object of a whole choice: its ``token_ids``, with their
        ``entries`` (one each)."""
        return self._shape(list(zip(token_ids, entries, strict=True)))

    def _shape(self, tokens: list[tuple[int, TokenLogprobs]]) -> dict[str, Any]:
        shown = [(token, entry) for token, entry in tokens if not self._tokenizer.is_special(token)]
        return self._chat_shape(shown) if self._chat else self._text_shape(shown)

    def _piece(self, token: int) -> tuple[str, bytes]:
        raw = self._tokenizer.token_bytes(token)
        return raw.decode("utf-8", errors="replace"), raw

    def _chat_shape(self, shown: list[tuple[int, TokenLogprobs]]) -> dict[str, Any]:
        def named(token: int, logprob: float) -> dict[str, Any]:
            text, raw = self._piece(token)
            return {"token": text, "logprob": logprob, "bytes": list(raw)}

        content = [
            named(token, entry.logprob) | {"top_logprobs": [named(i, lp) for i, lp in entry.top]}
            for token, entry in shown
        ]
        return {"content": content, "refusal": None}

    def _text_shape(self, shown: list[tuple[int, TokenLogprobs]]) -> dict[str, Any]:
        tokens, offsets, tops = [], [], []
        for token, entry in shown:
            text = self._piece(token)[0]
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
            # the alternatives by text, and the generated token always, as OpenAI's
            # ``logprobs`` (so up to k + 1 of them)
            top = {self._piece(i)[0]: lp for i, lp in entry.top}
            top.setdefault(text, entry.logprob)
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": [entry.logprob for _, entry in shown],
            "top_logprobs": tops,
            "text_offset": offsets,
        }
