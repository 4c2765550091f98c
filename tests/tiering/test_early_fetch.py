"""The engine's side of fetching early: a request that must queue names the pages L1 lacks
(``KVOffload.fetch_early``) as it is queued; one admitted at once does not. The tiers' side
(the fetch it starts, landed when the request is scheduled) is in ``test_store``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tests.support.engine import greedy, run_together, tiny_engine, tiny_llama
from workers.engine.offload import NoOffload

MODEL = tiny_llama(seed=3)


class RecordingOffload(NoOffload):
    """No tiers, but every early fetch the engine asks for is written down."""

    def __init__(self) -> None:
        self.early: list[tuple[str, tuple[int, ...], int, int]] = []

    def fetch_early(
        self, namespace: str, token_ids: Sequence[int], start_page: int, end_page: int
    ) -> None:
        self.early.append((namespace, tuple(token_ids), start_page, end_page))


def _prompt(seed: int, n: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def test_a_queued_request_asks_early_for_what_l1_lacks_and_an_admitted_one_does_not() -> None:
    offload = RecordingOffload()
    engine = tiny_engine(MODEL, offload=offload)
    try:
        a, b = _prompt(1, 70), _prompt(2, 70)
        await run_together(engine, ("a", a, greedy(2)), ("b", b, greedy(2)))
        # a was admitted at once; b queued behind it, nothing of it in L1: pages 0-3 (the
        # last token is always computed, so its page is not asked for)
        assert offload.early == [("", tuple(b), 0, 4)]
        # c continues a: a's four full pages are in L1, so c asks for the rest only
        c = a + _prompt(3, 40)
        await run_together(engine, ("d", _prompt(4, 30), greedy(2)), ("c", c, greedy(2)))
        assert offload.early[1:] == [("", tuple(c), 4, (len(c) - 1) // 16)]
    finally:
        engine.close()
