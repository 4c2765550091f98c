"""Continuous batching: which requests run this step, with which tokens, in which pages.

Every step the scheduler admits queued requests while the pool has room (device prefix
match first, then whatever the lower tiers hold, then pages for the rest), gives each
decoding request one token and fills the rest of the token budget with prefill chunks,
runs one forward pass, samples and emits. When a decoding request needs a page and none
can be freed by eviction, the youngest running request is preempted: its pages are freed
and it is requeued to recompute (prompt plus what it has generated so far). The oldest
request therefore always makes progress, and a sequence too long for the whole pool ends
with ``length`` instead of waiting forever.

Not thread-safe: one thread (the engine's) calls everything here.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from protocol.tiers import TierName
from workers.engine.api import FinishReason, GenerateRequest, TokenEvent, TokenLogprobs
from workers.engine.batch import build_batch
from workers.engine.held_back import HeldBackWait
from workers.engine.kv_pool import KVPool
from workers.engine.logprobs import StepLogprobs
from workers.engine.model import LlamaModel
from workers.engine.offload import KVOffload
from workers.engine.radix import PrefixHandle, RadixCache
from workers.engine.sampling import RequestSampler, sample
from workers.engine.scheduled import Scheduled, plan_step
from workers.engine.stats import EngineStats

log = logging.getLogger(__name__)


class Scheduler:
    """Admission, batching, preemption and bookkeeping for one model and one pool."""

    def __init__(
        self,
        model: LlamaModel,
        pool: KVPool,
        cache: RadixCache,
        offload: KVOffload,
        *,
        emit: Callable[[TokenEvent], None],
        max_batch: int,
        token_budget: int,
        context_length: int,
        eos_token_ids: Sequence[int],
    ) -> None:
        self.model = model
        self.pool = pool
        self.cache = cache
        self.offload = offload
        self.emit = emit
        self.max_batch = max_batch
        self.token_budget = token_budget
        self.context_length = context_length
        self.eos_token_ids = tuple(eos_token_ids)
        self.page_size = pool.page_size
        self.waiting: deque[Scheduled] = deque()
        self.running: list[Scheduled] = []
        self.stats = EngineStats()
        self._seq = 0
        self._held_back = HeldBackWait(pool)

    # --- requests in and out --------------------------------------------------------------------
    def add(self, request: GenerateRequest, sampler: RequestSampler) -> None:
        """Queue a request (validated by the engine, which built its ``sampler``)."""
        req = Scheduled(
            rid=request.rid,
            namespace=request.cache_salt,
            tokens=list(request.input_ids),
            prompt_len=len(request.input_ids),
            sampler=sampler,
            seq=0,
        )
        if request.sampling.max_tokens <= 0:
            self._emit(req, [], "length")
            return
        if not self._admissible(req):
            self._fetch_early(req)
        self.waiting.append(req)

    def _admissible(self, req: Scheduled) -> bool:
        """Whether ``req`` would be admitted at the next step (nobody ahead, room for it)."""
        need = self._pages_for(len(req.tokens)) + len(self.running)
        room = self.pool.free_pages + self.cache.evictable_pages
        return not self.waiting and len(self.running) < self.max_batch and need <= room

    def _fetch_early(self, req: Scheduled) -> None:
        """Start fetching from the lower tiers what L1 lacks of ``req``'s prompt, so that
        its wait in the queue hides the read (its admission then lands those pages)."""
        reusable = (len(req.tokens) - 1) // self.page_size
        held = len(self.cache.match(req.namespace, req.tokens, reusable).pages)
        if reusable <= held:
            return
        try:
            self.offload.fetch_early(req.namespace, req.tokens, held, reusable)
        except Exception:
            log.exception("starting an early fetch failed; admission fetches instead")

    def abort(self, rid: str) -> bool:
        """Drop ``rid`` wherever it is, freeing its pages without caching them."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._emit(req, [], "abort")
                return True
        for req in self.running:
            if req.rid == rid:
                self._release(req, cache=False)
                self.running.remove(req)
                self._emit(req, [], "abort")
                return True
        return False

    def abort_all(self) -> None:
        """End every request (used when a step failed and state cannot be trusted)."""
        for req in list(self.running) + list(self.waiting):
            self.abort(req.rid)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _emit(
        self,
        req: Scheduled,
        new: list[int],
        reason: FinishReason | None,
        logprobs: list[TokenLogprobs] | None = None,
    ) -> None:
        self.emit(
            TokenEvent(
                rid=req.rid,
                token_ids=new,
                finished=reason is not None,
                finish_reason=reason,
                prompt_tokens=req.prompt_len,
                completion_tokens=req.generated,
                cached_tokens=req.cached_tokens,
                cached_by_tier=dict(req.cached_by_tier),
                logprobs=logprobs or [],
            )
        )

    # --- pages ------------------------------------------------------------------------------------
    def _reserve(self, n: int) -> bool:
        """Make ``n`` pages free, evicting cached ones if needed; evicts nothing when that
        cannot free enough (a request waiting for room would empty the cache every step)."""
        short = n - self.pool.free_pages
        if short > 0:
            if short > self.cache.evictable_pages:
                return False
            self.cache.evict(short)
        return self.pool.free_pages >= n

    def _release(self, req: Scheduled, *, cache: bool) -> None:
        """Give back ``req``'s pages: cache its full computed pages or free them all."""
        own = req.pages[req.shared :]
        if cache:
            n_full = req.computed // self.page_size
            _, held = self.cache.insert(
                req.namespace, req.tokens[: n_full * self.page_size], req.pages[:n_full]
            )
            adopted = set(held[req.shared :])
            own = [p for p in own if p not in adopted]
        self.pool.free(own)
        if req.prefix is not None:
            self.cache.unlock(req.prefix)
        req.pages, req.shared, req.prefix, req.computed = [], 0, None, 0

    def _pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    # --- admission --------------------------------------------------------------------------------
    def _admit(self) -> None:
        ps = self.page_size
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            # leave the last token to compute: its logits pick the next token
            reusable = (len(req.tokens) - 1) // ps
            match = self.cache.match(req.namespace, req.tokens, reusable)
            self.cache.lock(match.node)
            need = self._pages_for(len(req.tokens)) - len(match.pages)
            # keep a page of headroom per running request so that admission does not
            # immediately force preemption
            if not self._reserve(need + len(self.running)):
                self.cache.unlock(match.node)
                if self.running:
                    return  # wait for running requests to give pages back
                if self._held_back.should_wait(req.rid):
                    # pages an abandoned restore still writes will come back: wait a little
                    # for them (nothing else could run meanwhile), then look again
                    self._held_back.wait()
                    return
                # Alone, everything else evicted, and still no room: it can never run. The
                # engine refuses such prompts up front; this guards against waiting forever.
                self.waiting.popleft()
                self.stats.finished_requests += 1
                self._emit(req, [], "length")
                continue
            self.waiting.popleft()
            own = self.pool.alloc(need)
            req.pages, req.shared, req.prefix = match.pages + own, len(match.pages), match.node
            tiers = [TierName.DEVICE] * len(match.pages)
            lower = self._load_lower(req, reusable)
            if lower is None:
                return
            tiers += lower
            req.computed = req.shared * ps
            if not req.admitted_once:
                req.admitted_once = True
                req.cached_tokens = req.computed
                for tier in tiers:
                    req.cached_by_tier[tier] = req.cached_by_tier.get(tier, 0) + ps
                self.stats.cached_tokens += req.cached_tokens
                for tier, n in req.cached_by_tier.items():
                    self.stats.cached_tokens_by_tier[tier] += n
            self._seq += 1
            req.seq = self._seq
            self.running.append(req)

    def _touch(self, req: Scheduled, n_pages: int) -> None:
        """Tell the lower tiers ``req`` used its first ``n_pages`` pages from L1."""
        try:
            self.offload.touch(req.namespace, req.tokens, n_pages)
        except Exception:
            # A failing lower tier costs the pages' recency there, never the request.
            log.exception("noting an L1 hit in the lower tiers failed")

    def _load_lower(self, req: Scheduled, reusable: int) -> list[str] | None:
        """Fill pages after the device match from the lower tiers; returns their tiers, or
        None when the request went back to wait (no page to replace a held-back one)."""
        start = req.shared
        if reusable <= start:
            if start:
                self._touch(req, start)  # nothing to ask the tiers for: note the L1 hit alone
            return []
        try:
            target = self.pool.restore_target(req.pages[start:reusable])
            restored = self.offload.load_prefix(req.namespace, req.tokens, start, target)
        except Exception:
            # A failing lower tier means recomputing those pages, not failing the request.
            log.exception("loading a prefix from the lower tiers failed; recomputing it")
            return []
        if restored.late:
            # an abandoned read may still write these pages: the pool holds them back and
            # the request takes others (reserved at admission, or evicted for here)
            held = {req.pages[start + j] for j in restored.late}
            if not self._reserve(len(held)):
                req.pages = [p for p in req.pages if p not in held]
                self._release(req, cache=False)
                self.waiting.appendleft(req)
                return None
            for j in sorted(restored.late):
                req.pages[start + j] = self.pool.alloc(1)[0]
        n = len(restored.tiers)
        if n == 0:
            return []
        node, held = self.cache.insert(
            req.namespace,
            req.tokens[: (start + n) * self.page_size],
            req.pages[: start + n],
            stored=True,  # they came from the tiers: never sent back down
        )
        assert held == req.pages[: start + n], "pages past the device match were cached"
        self._share(req, node, start + n)
        return list(restored.tiers)

    def _share(self, req: Scheduled, node: PrefixHandle, n_pages: int) -> None:
        """Record that ``req``'s first ``n_pages`` pages are now the cache's, pinned through
        ``node`` (the deepest of them) for as long as ``req`` holds them."""
        self.cache.lock(node)
        if req.prefix is not None:
            self.cache.unlock(req.prefix)
        req.prefix, req.shared = node, n_pages

    def _cache_prompt(self, req: Scheduled) -> None:
        """Give the cache ``req``'s full prompt pages once prefilled, while it decodes: a
        request with the same prefix shares them now, and under write-through they go down
        the tiers behind the decode instead of all at once when ``req`` ends (where another
        request cached some of these tokens first, its own pages wait for the end)."""
        n_full = req.computed // self.page_size
        if n_full <= req.shared:
            return
        if len(self.cache.match(req.namespace, req.tokens, n_full).pages) != req.shared:
            return
        node, held = self.cache.insert(
            req.namespace, req.tokens[: n_full * self.page_size], req.pages[:n_full]
        )
        assert held == req.pages[:n_full], "the cache kept pages of its own for the prompt"
        self._share(req, node, n_full)

    # --- one step ---------------------------------------------------------------------------------
    def _preempt_youngest(self) -> Scheduled:
        victim = max(self.running, key=lambda r: r.seq)
        self.running.remove(victim)
        # its computed pages go to the radix cache: evictable at once for whoever needs the
        # room, and on readmission found there (or restored from below) instead of recomputed
        self._release(victim, cache=True)
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1
        return victim

    def _grow(self) -> None:
        """Give every running request pages for all its tokens, preempting if needed."""
        for req in sorted(self.running, key=lambda r: r.seq):
            if req not in self.running:
                continue  # preempted while an older request grew
            need = self._pages_for(len(req.tokens)) - len(req.pages)
            while need > 0 and not self._reserve(need):
                if len(self.running) == 1:
                    self.running.remove(req)
                    self._release(req, cache=True)
                    self.stats.finished_requests += 1
                    self._emit(req, [], "length")  # alone and still too long for the pool
                    break
                if self._preempt_youngest() is req:
                    break
            else:
                if need > 0:
                    req.pages += self.pool.alloc(need)

    @torch.inference_mode()
    def step(self) -> bool:
        """Admit, run one forward pass, sample, emit. False when there was nothing to run."""
        self._admit()
        self._grow()
        if not self.running:
            return False
        started = time.perf_counter()
        plan = plan_step(self.running, self.token_budget)
        chunks, reqs = plan.chunks, plan.requests
        batch, order = build_batch(
            chunks,
            page_size=self.page_size,
            page_stride=self.pool.page_stride,
            device=self.model.device,
            dtype=self.model.kv_dtype,
        )
        logits = self.model.forward(batch, self.pool)
        wanting = [i for i in order if chunks[i].want_logits]
        samplers = [reqs[i].sampler for i in wanting]
        # before sampling, which may mask the logits in place; None when no row asked
        logprobs = StepLogprobs.of(logits, [s.params for s in samplers])
        picks = sample(logits, samplers, [reqs[i].generated for i in wanting])
        for req, chunk in zip(reqs, chunks, strict=True):
            req.computed += len(chunk.token_ids)
        entries = logprobs.entries(picks) if logprobs else [None] * len(picks)
        for i, token, entry in zip(wanting, picks, entries, strict=True):
            if token is None:
                self._drop_unsampleable(reqs[i])
            else:
                self._accept(reqs[i], token, entry, prefilled=plan.prefills[i])
        self.stats.record_step([len(c.token_ids) for c in chunks], time.perf_counter() - started)
        self.stats.evicted_pages = self.cache.evicted_pages
        return True

    def _accept(
        self,
        req: Scheduled,
        token: int,
        logprobs: TokenLogprobs | None = None,
        *,
        prefilled: bool = False,
    ) -> None:
        """Append ``token``; end ``req`` if it is done, else, if this step ended its prefill
        (``prefilled``), cache its prompt pages before the token goes out."""
        req.tokens.append(token)
        reason = req.sampler.finish_reason(token, req.generated)
        if reason is None and len(req.tokens) >= self.context_length:
            reason = "length"
        if reason is not None:
            self.running.remove(req)
            self._release(req, cache=True)
            self.stats.finished_requests += 1
        elif prefilled:
            self._cache_prompt(req)
        self._emit(req, [token], reason, [logprobs] if logprobs else [])

    def _drop_unsampleable(self, req: Scheduled) -> None:
        """End ``req`` alone with ``abort``: its logits left nothing to draw from (NaN or
        infinite, or every token masked). Its pages are freed, not cached: KV computed
        beside such logits is not to be trusted. The rest of the batch carries on."""
        log.error(
            "request %s: its next-token distribution has no finite probability mass; ending it",
            req.rid,
        )
        self.running.remove(req)
        self._release(req, cache=False)
        self.stats.finished_requests += 1
        self._emit(req, [], "abort")

    def flush_cache(self) -> bool:
        """Drop every unreferenced cached page; False (and nothing dropped) when busy."""
        if self.has_work:
            return False
        self.cache.flush()
        return True
