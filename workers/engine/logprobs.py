"""Log-probabilities of the tokens a step generates, for the requests that ask for them.

What is reported is the model's own next-token distribution: the log-softmax of its
logits, before temperature, top-k, top-p or the ``min_tokens`` mask shape what is drawn.
That is what OpenAI reports (its log-probabilities do not move with ``temperature``), what
vLLM reports by default (``raw_logprobs``), and what anyone can recompute from the model
and the tokens alone, whatever the sampling was. A greedy token is the most likely one, so
its logprob is the first alternative's.

A step's rows that did not ask cost one look at their parameters: nothing is computed for
them, and a step where no row asked computes nothing at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workers.engine.api import SamplingParams, TokenLogprobs

#: Most alternatives per token a request may ask for (OpenAI's ``top_logprobs`` bound).
MAX_TOP_LOGPROBS = 20


class StepLogprobs:
    """The log-probabilities of one step's rows that asked for them (see :meth:`of`)."""

    def __init__(self, rows: Sequence[int], logprobs: torch.Tensor, ks: Sequence[int]) -> None:
        #: step row -> row of ``logprobs``
        self._index = {row: j for j, row in enumerate(rows)}
        self._logprobs = logprobs
        self._ks = list(ks)
        k = min(max(self._ks), logprobs.shape[-1])
        values, ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0])
        self._top_values: list[list[float]] = values.tolist()
        self._top_ids: list[list[int]] = ids.long().tolist()

    @classmethod
    def of(cls, logits: torch.Tensor, params: Sequence[SamplingParams]) -> StepLogprobs | None:
        """Log-probabilities of the rows of ``logits`` (``[batch, vocab]``, the model's
        raw output) whose ``params`` ask for them; None when no row does.

        Call it before sampling: sampling may mask ``logits`` in place.
        """
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not rows:
            return None
        logprobs = logits[rows].float().log_softmax(dim=-1)
        return cls(rows, logprobs, [params[i].logprobs or 0 for i in rows])

    def at(self, row: int, token: int) -> TokenLogprobs | None:
        """Row ``row``'s log-probabilities, ``token`` being what it generated; None when the
        row did not ask."""
        j = self._index.get(row)
        if j is None:
            return None
        k = self._ks[j]
        top = tuple(zip(self._top_ids[j][:k], self._top_values[j][:k], strict=True))
        return TokenLogprobs(float(self._logprobs[j, token]), top)
