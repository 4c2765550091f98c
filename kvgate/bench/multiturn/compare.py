"""``--compare``: the identical workload on the built-in worker under each tier ladder.

Configurations (each on a fresh database, NAS directory and S3 prefix):

- ``recompute``: L1 only; evicted pages are dropped, every returning turn is prefilled again;
- ``host``: L1 + L2 (host RAM sized to hold the whole working set);
- ``nas``: L1 + L2 + L3, L2 as small as L1;
- ``object``: L1 + L2 + L3 + L4, L2 as small as L1 and tierd keeping the NAS small, so
  most returning pages come back from the object store;
- ``gateway_shared``: the gateway in front of two workers sharing the NAS and the object
  store, each turn's session key chosen so that the gateway's ring sends it to the other
  worker than the previous turn: every follow-up must resume from the shared tiers. The
  two split the machine's cores, as two GPU workers would each have a device: two
  engines whose OpenMP teams both spin on every core stall each other (measured: a quick
  run's 24 requests took 409 s instead of 62).

Then the no-reuse workload (first turns of fresh conversations only) on two fresh workers,
one without tiers and one with all of them (no tierd), the price of tiering when it cannot
help, played interleaved (:mod:`kvgate.bench.multiturn.noreuse`). Both start cold, so neither
inherits the other runs' queues or background work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import click
import httpx

from gateway.router import Router
from kvgate.bench.multiturn import noreuse, stack
from kvgate.bench.multiturn.driver import Plan, Result, Target, run
from kvgate.bench.multiturn.metrics import Summary, summarize
from kvgate.bench.multiturn.workload import Conversation, Shape, conversations
from kvgate.models.registry import DEFAULT_MODEL
from kvgate.settings import load_settings
from protocol.fields import SESSION_HEADER
from protocol.registry import WorkerInfo

CONFIGS: tuple[str, ...] = ("recompute", "host", "nas", "object", "gateway_shared")
#: the configurations that need the object store (SeaweedFS starts only for them)
OBJECT_CONFIGS = frozenset({"object", "gateway_shared"})
#: host RAM of the ``host`` configuration, as a multiple of the working set's KV
HOST_ALL_SLACK = 1.25
GATEWAY_WORKERS = ("bench-a", "bench-b")
#: per request of a no-reuse wave, tokens beyond its words: the chat template's role
#: markers, the last partial page, the page of headroom admission keeps per request
NO_REUSE_SLACK_TOKENS = 64


@dataclass(frozen=True)
class Spec:
    """Sizes of one comparison run (tokens are converted to bytes with the model's KV size)."""

    conversations: int
    active: int
    clients: int
    warmup: int
    max_requests: int
    #: device KV pool (L1) of every worker
    l1_tokens: int
    #: host RAM (L2) of ``nas``/``object``/``gateway_shared`` workers
    small_l2_tokens: int
    #: tierd's NAS high watermark in ``object`` (low is half of it)
    small_nas_tokens: int
    restore_lengths: tuple[int, ...]
    no_reuse_requests: int
    seed: int = 0
    shape: Shape = field(default_factory=Shape)


QUICK = Spec(
    conversations=12, active=12, clients=8, warmup=12, max_requests=24,
    l1_tokens=6144, small_l2_tokens=1024, small_nas_tokens=4096,
    restore_lengths=(4000,), no_reuse_requests=24,
)  # fmt: skip
#: The full run plays 24 conversations to their last turn (181 requests per configuration),
#: a working set of about 77,000 tokens: 8.3x its L1. Its L1 holds about three late-turn
#: histories of the 8 concurrent clients', as a GPU's pool holds its running batch but not
#: the idle conversations. A run takes about an hour on 2 CPU cores; the first turns (which
#: no tier can help) are its warm-up. Its no-reuse pair plays 7 waves of 8 first turns on
#: each worker (one warm-up, six measured; an odd count keeps the alternation balanced);
#: the quick run's plays 3.
FULL = Spec(
    conversations=24, active=24, clients=8, warmup=24, max_requests=0,
    l1_tokens=9216, small_l2_tokens=2048, small_nas_tokens=8192,
    restore_lengths=(1000, 4000, 7000), no_reuse_requests=56,
)  # fmt: skip


@dataclass
class ConfigRun:
    """One configuration's results."""

    name: str
    summary: Summary
    results: list[Result]
    seconds: float


class Compare:
    """Runs the comparison on :class:`stack.Services`; ``kv_bytes`` is the model's KV per token."""

    def __init__(self, svc: stack.Services, spec: Spec, kv_bytes: int, log_dir: Path) -> None:
        self.svc = svc
        self.spec = spec
        self.kv_bytes = kv_bytes
        self.log_dir = log_dir
        self.workload = conversations(spec.conversations, spec.shape, spec.seed)
        fresh = conversations(spec.no_reuse_requests, spec.shape, spec.seed + 1)
        self.no_reuse = [replace(c, turns=c.turns[:1]) for c in fresh]
        self._sites: list[stack.Site] = []

    def working_set_tokens(self) -> int:
        """Tokens of KV the played histories add up to (answers at their asked length).

        The turns reached are those of the round-robin order with ``max_requests`` applied;
        this is the KV that would have to stay resident for no turn to recompute.
        """
        s = self.spec
        pending = deque(self.workload)
        ready = deque(pending.popleft() for _ in range(min(s.active, len(pending))))
        reached: dict[str, int] = {}
        issued = 0
        while ready and (not s.max_requests or issued < s.max_requests):
            conv = ready.popleft()
            reached[conv.cid] = reached.get(conv.cid, 0) + 1
            issued += 1
            if reached[conv.cid] < len(conv.turns):
                ready.append(conv)
            elif pending:
                ready.append(pending.popleft())
        return sum(c.tokens(reached[c.cid]) for c in self.workload if c.cid in reached)

    def site(self, name: str, **settings: object) -> stack.Site:
        """A fresh site whose workers have the run's L1 pool (unless ``settings`` say)."""
        pool = {"worker_kv_pool_bytes": self.spec.l1_tokens * self.kv_bytes}
        site = stack.new_site(self.svc, name, **(pool | settings))
        self._sites.append(site)
        return site

    def _drop_nas(self) -> None:
        """Delete the NAS directories of the sites used so far: a full run's working set is
        gigabytes per configuration, and no later configuration reads another's pages."""
        for site in self._sites:
            shutil.rmtree(site.nas, ignore_errors=True)
        self._sites.clear()

    def plan(self) -> Plan:
        s = self.spec
        return Plan(s.clients, s.active, s.warmup, s.max_requests)

    def run_all(
        self, only: tuple[str, ...] = CONFIGS
    ) -> tuple[dict[str, ConfigRun], dict, dict[str, str]]:
        """Every configuration in ``only``, then the no-reuse pair.

        Returns (runs, no-reuse figures, failures): a configuration that cannot start is
        reported with its reason and the others still run, since one run takes many minutes.
        """
        runs: dict[str, ConfigRun] = {}
        no_reuse: dict[str, dict] = {}
        failures: dict[str, str] = {}
        for name in only:
            click.echo(f"--- {name}", err=True)
            try:
                with self._serving(name) as (target, headers_for):
                    runs[name] = self._play(name, target, self.workload, self.plan(), headers_for)
            except (stack.PartError, OSError, RuntimeError) as exc:
                failures[name] = str(exc)
                click.echo(f"{name} failed: {exc}", err=True)
                continue
            finally:
                self._drop_nas()
            s = runs[name].summary
            click.echo(
                f"{name}: {s.rps:.3f} req/s, TTFT p50 {s.ttft_p50:.2f}s, "
                f"cached {s.cached_ratio:.0%}, errors {s.errors}",
                err=True,
            )
        if self.no_reuse:
            click.echo("--- no reuse, tiering off vs on, interleaved", err=True)
            try:
                no_reuse = self._no_reuse_pair()
            except (stack.PartError, OSError, RuntimeError, ValueError, httpx.HTTPError) as exc:
                failures["no_reuse"] = str(exc)
                click.echo(f"no reuse failed: {exc}", err=True)
        return runs, no_reuse, failures

    def no_reuse_l1_tokens(self) -> int:
        """An L1 that holds the largest wave of the no-reuse pair whole.

        With less, a wave's requests preempt one another, and a preempted request's pages
        come back from host RAM when tiering is on but are recomputed when it is off: the
        pair would measure that help, not the price of tiering when it cannot help. Older
        waves' pages are still evicted to make room (with tiering, each request's pages
        went down when it ended).
        """
        waves = noreuse.waves(self.no_reuse, self.spec.clients)
        return max(sum(c.tokens(1) + NO_REUSE_SLACK_TOKENS for c in wave) for wave in waves)

    def _no_reuse_pair(self) -> dict[str, dict]:
        """Both no-reuse workers side by side, played in interleaved waves (see
        :mod:`kvgate.bench.multiturn.noreuse`)."""
        every_tier = "host,nas,object" if self.svc.s3 is not None else "host,nas"
        sizes = {
            "tier_host_bytes": self.spec.small_l2_tokens * self.kv_bytes,
            "worker_kv_pool_bytes": self.no_reuse_l1_tokens() * self.kv_bytes,
        }
        logs = self.log_dir / "no-reuse"
        with contextlib.ExitStack() as workers:
            sides = []
            for label, tiers in (("off", ""), ("on", every_tier)):
                site = self.site(f"noreuse_{label}", **sizes)
                url = workers.enter_context(stack.worker(f"noreuse-{label}", tiers, site, logs))
                sides.append(noreuse.Side(label, url, tiered=bool(tiers)))
            return noreuse.play((sides[0], sides[1]), self.no_reuse, self.spec.clients)

    def _play(
        self,
        name: str,
        target: Target,
        convs: list[Conversation],
        plan: Plan,
        headers_for: Callable[[str, int], dict[str, str]] | None = None,
    ) -> ConfigRun:
        start = time.perf_counter()
        results = asyncio.run(run(target, convs, plan, headers_for=headers_for))
        return ConfigRun(name, summarize(results), results, time.perf_counter() - start)

    @contextlib.contextmanager
    def _serving(self, name: str) -> Iterator[tuple[Target, Callable | None]]:
        small_l2 = self.spec.small_l2_tokens * self.kv_bytes
        logs = self.log_dir / name
        if name == "recompute":
            with stack.worker(name, "", self.site(name), logs) as url:
                yield Target(url), None
        elif name == "host":
            room = int(self.working_set_tokens() * HOST_ALL_SLACK) + self.spec.l1_tokens
            site = self.site(name, tier_host_bytes=room * self.kv_bytes)
            with stack.worker(name, "host", site, logs) as url:
                yield Target(url), None
        elif name == "nas":
            with stack.worker(name, "host,nas", self.site(name, tier_host_bytes=small_l2), logs) as url:  # fmt: skip
                yield Target(url), None
        elif name == "object":
            nas = self.spec.small_nas_tokens * self.kv_bytes
            site = self.site(
                name, tier_host_bytes=small_l2, tier_nas_high_bytes=nas,
                tier_nas_low_bytes=nas // 2, tierd_interval_s=1.0,
            )  # fmt: skip
            with stack.tierd(site, logs), stack.worker(name, "host,nas,object", site, logs) as url:
                yield Target(url), None
        elif name == "gateway_shared":
            with self._gateway_shared(small_l2, logs) as served:
                yield served
        else:
            raise click.UsageError(f"unknown configuration {name!r}; pick from {CONFIGS}")

    @contextlib.contextmanager
    def _gateway_shared(self, small_l2: int, logs: Path) -> Iterator[tuple[Target, Callable]]:
        site = self.site("gateway_shared", tier_host_bytes=small_l2)
        cores = max(1, (os.cpu_count() or 1) // len(GATEWAY_WORKERS))
        site = replace(site, env=site.env | {"OMP_NUM_THREADS": str(cores)})
        model = load_settings().worker_model or DEFAULT_MODEL  # the id the workers serve
        with contextlib.ExitStack() as workers:
            for wid in GATEWAY_WORKERS:
                workers.enter_context(
                    stack.registered_worker(wid, "host,nas,object", model, site, logs)
                )
            with stack.gateway(site, logs) as url:
                target = Target(url, api_key=stack.api_key(site), model=model)
                yield target, alternating_sessions(model, GATEWAY_WORKERS)


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
