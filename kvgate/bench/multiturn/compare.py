"""``--compare``: one workload's measured turns on the built-in worker under each tier ladder.

The conversations are primed once: the ``host`` worker plays their first turns, and the
KV it writes through to the NAS (with its ledger rows) is what every other configuration
starts from, each on a copy of its own (:func:`stack.snapshot`): the same histories, the
same pages, and none of another configuration's later pages. Then every configuration is
up at once and they play the same measured follow-up turns from the same point, round by
round (:mod:`kvgate.bench.multiturn.interleave`), so that the machine's drift weighs on all
alike:

- ``infinite``: the ideal. A pool that holds every history the run will have; the primed
  histories are brought into it from the NAS before the clock starts, and nothing is ever
  evicted (write-through off, so no page ever goes down);
- ``recompute``: L1 only; evicted pages are dropped, every returning turn is prefilled;
- ``host``: L1 + L2, host RAM holding the whole working set (the primer itself: it also
  writes through to the NAS, as ``nas`` does);
- ``nas``: L1 + L2 + L3 with a small L2, so returning pages come from the NAS;
- ``object``: L1 + L2 + L3 + L4, every primed page moved to the object store first and
  tierd keeping the NAS small, so returning pages come from S3;
- ``gateway_shared``: the gateway in front of two workers sharing the NAS and the object
  store, each follow-up turn routed to the other worker than the turn before; the two
  split the machine's cores, as two GPU workers would each have a device.

In every configuration but ``infinite`` the pool holds what the concurrent requests need
at once (:mod:`kvgate.bench.multiturn.sizing`), so decoding batches as with infinite memory
and only the idle conversations' histories live below L1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import click
import httpx

from gateway.router import Router
from kvgate.bench.multiturn import noreuse, restore, sizing, stack
from kvgate.bench.multiturn.driver import History, Plan, Result, Target, model_of, run, send
from kvgate.bench.multiturn.interleave import Played, Served, interleave
from kvgate.bench.multiturn.metrics import Summary, summarize
from kvgate.bench.multiturn.workload import WORKLOADS, Shape, Turn, conversations, words
from kvgate.models.registry import DEFAULT_MODEL
from kvgate.settings import load_settings
from protocol.fields import SESSION_HEADER
from protocol.registry import WorkerInfo

CONFIGS: tuple[str, ...] = ("infinite", "recompute", "host", "nas", "object", "gateway_shared")
#: the configurations that need the object store (SeaweedFS starts only for them)
OBJECT_CONFIGS = frozenset({"object", "gateway_shared"})
#: the configurations that start from the primed NAS
PRIMED_CONFIGS = frozenset({"infinite", "nas", "object", "gateway_shared"})
#: host RAM of ``host``, as a multiple of the working set's KV
HOST_ALL_SLACK = 1.25
GATEWAY_WORKERS = ("bench-a", "bench-b")
#: the warm-up request's prompt, in words (one SmolLM2 token each)
WARM_UP_TOKENS = 256


@dataclass(frozen=True)
class Spec:
    """One workload's sizes; pools and primed conversations follow from them (see
    :mod:`kvgate.bench.multiturn.sizing`)."""

    workload: str
    #: requests in flight at once (closed-loop clients)
    clients: int
    #: conversations drawn; the fewest that leave ``idle_over_pool`` x the pool idle play
    conversations: int
    idle_over_pool: float
    #: measured follow-up turns per configuration (a budgeted run sizes it again)
    measured: int
    #: L2 of ``nas``, ``object`` and ``gateway_shared``; tierd's NAS watermark in ``object``
    small_l2_tokens: int
    small_nas_tokens: int
    seed: int = 0
    shape: Shape = field(default_factory=Shape)
    #: the configurations this workload is played in (``--configs`` narrows them further)
    configs: tuple[str, ...] = CONFIGS

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; pick from {sorted(WORKLOADS)}")


class Compare:
    """One workload's comparison on :class:`stack.Services`; ``kv_bytes`` is the model's KV
    per token."""

    def __init__(self, svc: stack.Services, spec: Spec, kv_bytes: int, log_dir: Path) -> None:
        self.svc, self.spec, self.kv_bytes = svc, spec, kv_bytes
        self.log_dir = log_dir / spec.workload
        drawn = conversations(spec.conversations, spec.shape, spec.seed)
        self.workload = drawn[: sizing.primed(drawn, spec.clients, 1, spec.idle_over_pool)]
        self.measured = spec.measured
        #: the :func:`time.perf_counter` reading by which the measured rounds must end (None:
        #: no deadline, every measured turn is played)
        self.deadline: float | None = None
        self.pool_tokens = sizing.pool_tokens(self.workload, spec.clients, range(1, 2))
        #: the KV namespace of every request (the gateway's team is given it too)
        self.salt = f"bench-{spec.workload}-{spec.seed}"
        self.primed: list[History] = []
        self.first_turns: Summary | None = None
        self._primed_site: stack.Site | None = None
        self._last_turn = 1

    # --- sizes ---------------------------------------------------------------------------
    def idle_tokens(self) -> int:
        """KV of the primed histories not in flight (the ``clients`` largest are)."""
        sizes = sorted(c.tokens(1) for c in self.workload)
        return sum(sizes[: -self.spec.clients])

    def served_idle_tokens(self) -> int:
        """:meth:`idle_tokens` as the server counted the primed histories (after priming)."""
        sizes = sorted(h.kv_tokens for h in self.primed)
        return sum(sizes[: -self.spec.clients])

    def working_set_tokens(self) -> int:
        """KV of every primed history."""
        return sum(c.tokens(1) for c in self.workload)

    def measured_bounds(self) -> tuple[int, int]:
        """The fewest and most measured turns per configuration :meth:`resize` may take now.

        Before priming: one per client, up to every follow-up turn each primed conversation
        has (round-robin, so a conversation's second follow-up comes after every first).
        After priming the pool is fixed, so only as many as keep the last turn played,
        which sized it."""
        n = len(self.workload)
        if not self.primed:
            return self.spec.clients, n * min(len(c.turns) - 1 for c in self.workload)
        return max(self.spec.clients, (self._last_turn - 1) * n + 1), self._last_turn * n

    def resize(self, measured: int) -> None:
        """Play ``measured`` follow-up turns per configuration (round-robin from the primed
        histories); the pool grows to hold the largest request they reach. After priming
        the pool is fixed: ``measured`` must stay within :meth:`measured_bounds`."""
        self.measured = measured
        last = 1 + max(0, measured - 1) // len(self.workload)
        self.pool_tokens = sizing.pool_tokens(self.workload, self.spec.clients, range(1, last + 1))
        self._last_turn = last

    # --- priming ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def priming(self, primed: Callable[[], None] = lambda: None) -> Iterator[Served]:
        """Prime on the ``host`` worker (first turns, reported as :attr:`first_turns`),
        keep a copy of its NAS and ledger as the primed site, call ``primed`` (a budgeted
        run sizes its measured turns there), then yield ``host`` to be played; its worker
        stops when the block ends."""
        room = int(self.working_set_tokens() * HOST_ALL_SLACK) + self.pool_tokens
        site = self._site("host", tier_host_bytes=room * self.kv_bytes)
        with stack.worker("host", "host,nas", site, self.log_dir / "host") as url:
            self.primed = [History(c) for c in self.workload]
            n = len(self.primed)
            plan = Plan(self.spec.clients, n, 0, n)
            results = asyncio.run(run(self._target(url), self.primed, plan))
            if errors := [r.error for r in results if r.error]:
                raise RuntimeError(f"priming failed: {errors[0]}")
            self.first_turns = summarize(results)
            asyncio.run(noreuse.drained(url))
            # frozen here: host's own measured turns must not leave pages the others find
            self._primed_site = stack.snapshot(self.svc, site, f"{self.spec.workload}_primed")
            primed()
            yield Served("host", self._target(url), drain_urls=(url,))

    # --- the other configurations ----------------------------------------------------------
    @contextlib.contextmanager
    def serving(self, name: str) -> Iterator[Served]:
        """``name`` (not ``host``: see :meth:`priming`) up and warm for the block: a warm-up
        request on each fresh worker (``infinite``'s is warm from bringing in its histories,
        and its pool has no page to spare for another prompt)."""
        with self._serving(name) as served:
            if name != "infinite":
                tokens = min(WARM_UP_TOKENS, self.pool_tokens // 2)
                asyncio.run(warm_up(served.target, served.headers_for, tokens, self.spec.seed))
            yield served

    def play(
        self,
        served: Sequence[Served],
        after_round: Callable[[dict[str, Played]], None] = lambda played: None,
    ) -> dict[str, Played]:
        """The measured turns of every configuration of ``served``, played in rounds (see
        :mod:`kvgate.bench.multiturn.interleave`) from the primed histories; ``after_round``
        sees them at the end of each round; they stop before a round that would end past
        :attr:`deadline`."""
        return interleave(
            served, self.primed, self.measured, self.spec.clients, after_round, self.deadline
        )

    def _target(self, url: str) -> Target:
        return Target(url, cache_salt=self.salt)

    def _site(self, name: str, **settings: object) -> stack.Site:
        pool = {"worker_kv_pool_bytes": self.pool_tokens * self.kv_bytes}
        return stack.new_site(self.svc, f"{self.spec.workload}_{name}", **(pool | settings))

    def _from_primed(self, name: str, **settings: object) -> stack.Site:
        """A copy of the primed site with ``settings`` (env names without ``KVGATE_``)."""
        if self._primed_site is None:
            raise RuntimeError(f"{name} starts from the primed NAS: run host first")
        site = stack.snapshot(self.svc, self._primed_site, f"{self.spec.workload}_{name}")
        env = {f"KVGATE_{k.upper()}": str(v) for k, v in settings.items()}
        return replace(site, env=site.env | env)

    @contextlib.contextmanager
    def _serving(self, name: str) -> Iterator[Served]:
        logs = self.log_dir / name
        small_l2 = self.spec.small_l2_tokens * self.kv_bytes
        if name == "recompute":
            with stack.worker(name, "", self._site(name), logs) as url:
                yield Served(name, self._target(url))
        elif name == "infinite":
            pool = sizing.infinite_pool_tokens(
                self.workload, self.primed, self.spec.clients, self._last_turn
            )
            site = self._from_primed(
                name, worker_kv_pool_bytes=pool * self.kv_bytes, tier_host_bytes=0,
                tier_write_through="false",
            )  # fmt: skip
            with stack.worker(name, "host,nas", site, logs) as url:
                self._bring_in(url)
                yield Served(name, self._target(url))  # write-through off: nothing goes down
        elif name == "nas":
            site = self._from_primed(name, tier_host_bytes=small_l2)
            with stack.worker(name, "host,nas", site, logs) as url:
                yield Served(name, self._target(url), drain_urls=(url,))
        elif name == "object":
            nas = self.spec.small_nas_tokens * self.kv_bytes
            site = self._from_primed(
                name, tier_host_bytes=small_l2, tier_nas_high_bytes=nas,
                tier_nas_low_bytes=nas // 2, tierd_interval_s=1.0,
            )  # fmt: skip
            restore.demote_everything(site, logs)
            with stack.tierd(site, logs), stack.worker(name, "host,nas,object", site, logs) as url:
                yield Served(name, self._target(url), drain_urls=(url,))
        elif name == "gateway_shared":
            with self._gateway_shared(small_l2, logs) as served:
                yield served
        else:
            raise click.UsageError(f"unknown configuration {name!r}; pick from {CONFIGS}")

    def _bring_in(self, url: str) -> None:
        """Restore every primed history into ``infinite``'s pool from the NAS, untimed: each
        is sent once more with a one-word message and a one-token answer."""
        asks = [h.copy() for h in self.primed]
        for h in asks:
            h.conv = replace(h.conv, turns=(*h.conv.turns[: h.next_turn], _ONE_WORD))
        plan = Plan(self.spec.clients, len(asks), 0, 0)
        results = asyncio.run(run(self._target(url), asks, plan))
        if errors := [r.error for r in results if r.error]:
            raise RuntimeError(f"bringing the histories into infinite failed: {errors[0]}")

    @contextlib.contextmanager
    def _gateway_shared(self, small_l2: int, logs: Path) -> Iterator[Served]:
        site = self._from_primed("gateway_shared", tier_host_bytes=small_l2)
        cores = max(1, (os.cpu_count() or 1) // len(GATEWAY_WORKERS))
        site = replace(site, env=site.env | {"OMP_NUM_THREADS": str(cores)})
        model = load_settings().worker_model or DEFAULT_MODEL  # the id the workers serve
        with (
            stack.registered_workers(
                GATEWAY_WORKERS, "host,nas,object", model, site, logs
            ) as workers,
            stack.gateway(site, logs) as url,
        ):
            target = Target(url, api_key=stack.api_key(site, self.salt), model=model)
            sessions = alternating_sessions(model, GATEWAY_WORKERS)
            yield Served("gateway_shared", target, sessions, drain_urls=tuple(workers))


#: the turn that brings a history into ``infinite``'s pool
_ONE_WORD = Turn("thanks", 1)


async def warm_up(target: Target, headers_for: Callable | None, tokens: int, seed: int) -> None:
    """One request of ``tokens`` words per worker behind ``target`` (both gateway workers
    when ``headers_for`` routes), in a KV namespace of its own where ``target`` names one,
    so a fresh worker's one-off costs (CUDA context and kernel selection, the allocator's
    first touch) are not charged to the first measured turn: on an H200 a cold worker's
    first 2,048-token prefill ran at 27% of the warm rate."""
    if target.cache_salt:
        target = replace(target, cache_salt=f"{target.cache_salt}-warm-up")
    messages = [{"role": "user", "content": words(random.Random(seed), tokens)}]
    workers = len(GATEWAY_WORKERS) if headers_for else 1
    async with httpx.AsyncClient(timeout=600) as client:
        model = await model_of(client, target)
        for turn in range(workers):
            result = Result("warm-up", turn, 0.0)
            headers = headers_for("warm-up", turn) if headers_for else None
            await send(client, target, model, messages, 2, result, headers=headers)
            if result.error:
                raise RuntimeError(f"the warm-up request failed: {result.error}")


def alternating_sessions(model: str, worker_ids: tuple[str, ...]) -> Callable:
    """``X-Session-Id`` per turn such that turn ``t`` lands on ``worker_ids[t % n]``.

    A new session goes to its ring owner on the gateway's consistent-hash ring (balanced
    load keeps it there), so a key is chosen per turn whose owner is the wanted worker: the
    gateway stays unmodified and every follow-up turn changes worker.
    """
    infos = [WorkerInfo(w, f"http://{w}", model, 64, 0) for w in worker_ids]

    def owner(session: str) -> str:
        router = Router(load_factor=1e9)  # no load bounds: the pure ring owner
        router.update(infos)
        chosen = router.choose(model, "h:" + session, lambda _: True)
        assert chosen is not None
        return chosen.worker_id

    def headers_for(cid: str, turn: int) -> dict[str, str]:
        want = worker_ids[turn % len(worker_ids)]
        n = 0
        while owner(key := f"{cid}-t{turn}-{n}") != want:
            n += 1
        return {SESSION_HEADER: key}

    return headers_for
