"""Grammar-constrained decoding: a request's output follows a JSON schema or a tool-call format.

xgrammar (the library SGLang uses, so both kinds of worker take the same schemas) compiles a
schema against the model's vocabulary once (:class:`Grammars`); each constrained request
then runs a matcher of that grammar (:class:`GrammarState`). Before a step, the matcher says
which tokens may come next, as a bitmask :func:`constrain` applies to the request's logits
(rows where every token is allowed are skipped); after it, the matcher takes the token
picked. Once the grammar is complete only the model's end-of-sequence tokens are allowed;
taking one ends the matcher, and with it the request (``stop``, even with ``ignore_eos``).

On a GPU the bitmask is filled on the CPU while the forward pass still runs (nothing
waits for the logits before :func:`constrain` returns), so its cost hides behind the step.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    # imported where used: xgrammar pulls in transformers, ~0.8 s of a worker's start that
    # only a request with a grammar needs (Python imports each once; later uses are free)
    import xgrammar as xgr

#: Most whitespace characters between two JSON tokens inside a tool call's arguments. Small
#: models can fall into emitting newlines for ever inside a JSON object; a cap ends that
#: while leaving room for indented output (a 2-space indent ten levels deep is 21 characters).
MAX_WHITESPACE = 24

#: what xgrammar's C++ side prefixes its messages with: ``[12:09:59] /path/file.cc:4175: ``
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class GrammarError(ValueError):
    """A schema or format that cannot be compiled; the message says what is wrong in it."""


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar: immutable, shared by every request (and choice) that uses it."""

    compiled: xgr.CompiledGrammar
    #: what it constrains to, for messages and logs (``json_schema``, ``tool calls``)
    describes: str


class Grammars:
    """Compiles grammars for one model's vocabulary (thread-safe; results are cached)."""

    def __init__(self, info: xgr.TokenizerInfo) -> None:
        import xgrammar as xgr

        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=64 * 2**20)

    @classmethod
    def for_tokenizer(
        cls, backend: HFTokenizer, *, vocab_size: int, stop_token_ids: Sequence[int]
    ) -> Grammars:
        """Grammars over ``backend``'s vocabulary, padded to the model's ``vocab_size`` (its
        logits' width), ending on ``stop_token_ids`` (the model's EOS ids)."""
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        # xgrammar reads the vocabulary's kind (byte-level or not) from a transformers tokenizer
        wrapped = PreTrainedTokenizerFast(tokenizer_object=backend)
        info = xgr.TokenizerInfo.from_huggingface(
            wrapped, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        return cls(info)

    def json_schema(self, schema: Mapping[str, Any] | None) -> Grammar:
        """JSON following ``schema``; None is any JSON object (OpenAI's ``json_object``).

        The JSON is compact (no whitespace between tokens, as OpenAI's structured outputs
        are): with whitespace allowed, even capped per gap, a small or sampled model spends
        its whole ``max_tokens`` on newlines between the fields and never closes the object.
        """
        text = json.dumps({"type": "object"} if schema is None else schema)
        try:
            compiled = self._compiler.compile_json_schema(text, any_whitespace=False)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(_message(exc)) from None
        return Grammar(compiled, "json_object" if schema is None else "json_schema")

    def structural_tag(self, tag: Mapping[str, Any], describes: str) -> Grammar:
        """Text following an xgrammar structural tag (markup around JSON, as tool calls are)."""
        try:
            compiled = self._compiler.compile_structural_tag(json.dumps(tag))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(_message(exc)) from None
        return Grammar(compiled, describes)


def _message(exc: Exception) -> str:
    """xgrammar's complaint, without the C++ source location it comes with."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _LOG_PREFIX.sub("", first)


class GrammarState:
    """One request's place in its grammar."""

    def __init__(self, grammar: Grammar) -> None:
        import xgrammar as xgr

        self.grammar = grammar
        self._matcher = xgr.GrammarMatcher(grammar.compiled)

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False when the grammar does not allow it."""
        return bool(self._matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        """Whether the grammar is complete and its end token taken: the request ends."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into ``bitmask[row]``; False when every token is
        allowed (nothing to apply)."""
        return bool(self._matcher.fill_next_token_bitmask(bitmask, row))


#: xgrammar's kernel for CUDA logits is Triton's; without Triton, its plain torch one
_GPU_BACKEND = "triton" if importlib.util.find_spec("triton") else "torch_native"


def constrain(logits: torch.Tensor, states: Sequence[GrammarState | None]) -> None:
    """Mask, in place, the tokens each row's grammar forbids (``-inf``); rows without a
    grammar are left as they are, and so are rows whose grammar allows every token.

    The masks are filled one row after another on the calling thread: a fill takes ~2 µs
    per row, and xgrammar's thread pool for batches cost 0.1 ms to wake, and 2 ms a step
    while the engine's OpenMP threads still spun on the same two cores.
    """
    rows = [i for i, s in enumerate(states) if s is not None]
    if not rows:
        return
    import xgrammar as xgr

    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(len(states), vocab)
    rows = [i for i in rows if states[i].fill(bitmask, i)]  # type: ignore[union-attr]
    if not rows:
        return
    if logits.device.type == "cpu" and sys.byteorder == "little":
        _apply_on_cpu(logits, bitmask, rows)
    elif logits.device.type == "cpu":
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=rows)
    else:
        on_device = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(
            logits, on_device, vocab_size=vocab, indices=rows, backend=_GPU_BACKEND
        )


def _apply_on_cpu(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """``-inf`` where ``bitmask`` (xgrammar's: bit ``t % 32`` of word ``t // 32`` set when
    token ``t`` is allowed) has a 0, in ``rows`` of ``logits``.

    xgrammar's own CPU kernel takes 2 ms for 8 rows of a 49k vocabulary (4.5% of a batch-8
    decode step of SmolLM2 on 2 cores); numpy unpacks the bits and masks in 0.3 ms. The
    words are little-endian, so their bytes unpacked little-end first are the tokens in
    order (a big-endian host takes xgrammar's kernel instead).
    """
    index = list(rows)
    words = bitmask[index].numpy()
    allowed = np.unpackbits(
        words.view(np.uint8), axis=-1, count=logits.shape[-1], bitorder="little"
    )
    view = logits.numpy()
    if len(index) == logits.shape[0]:
        np.copyto(view, -np.inf, where=allowed == 0)
    else:
        picked = view[index]
        np.copyto(picked, -np.inf, where=allowed == 0)
        view[index] = picked
