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
        #: the step rows that asked, in the order of the rows of ``logprobs``
        self._rows = list(rows)
        self._logprobs = logprobs
        k = min(max(ks), logprobs.shape[-1])
        values, ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0])
        #: per row that asked, its ``k`` most likely ``(token id, logprob)``
        self._tops = [
            tuple(zip(row_ids[:k_row], row_values[:k_row], strict=True))
            for row_ids, row_values, k_row in zip(ids.tolist(), values.tolist(), ks, strict=True)
        ]

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

    def entries(self, picks: Sequence[int | None]) -> list[TokenLogprobs | None]:
        """Per row of the step, its log-probabilities given the token it drew (``picks``,
        as :func:`sampling.sample` returns them); None for a row that did not ask or drew
        nothing. One gather for every row, one copy off the device."""
        chosen = torch.tensor([picks[row] or 0 for row in self._rows], device=self._logprobs.device)
        values: list[float] = self._logprobs.gather(1, chosen[:, None]).squeeze(1).tolist()
        out: list[TokenLogprobs | None] = [None] * len(picks)
        for j, row in enumerate(self._rows):
            if picks[row] is not None:
                out[row] = TokenLogprobs(values[j], self._tops[j])
        return out
