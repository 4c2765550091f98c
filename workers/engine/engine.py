"""``TorchEngine``: the built-in engine behind :class:`workers.engine.api.Engine`.

The model, pool, radix cache and scheduler live on one background thread that loops
"apply queued commands, run one step" (torch releases the GIL inside its kernels, so the
event loop stays responsive). ``generate`` hands the request to that thread and returns an
async iterator fed with ``loop.call_soon_threadsafe``; closing it early aborts the request.

A step serves every running request at once, so what one request brings must not fail it:
``generate`` checks the prompt and builds the request's sampler (which checks its sampling
parameters) before the request is queued, a request whose logits leave nothing to sample
ends alone (see ``Scheduler.step``), and only a step that fails as a whole (the forward
pass, the pages) ends every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import torch

from tiering.cold_storage import ColdStorageUnavailable
from workers.engine import cold_storage
from workers.engine.api import EngineLoad, GenerateRequest, SentDown, TokenEvent
from workers.engine.config import ModelConfig
from workers.engine.kv_pool import KVPool
from workers.engine.model import LlamaModel
from workers.engine.offload import KVOffload, NoOffload
from workers.engine.radix import RadixCache
from workers.engine.sampling import RequestSampler
from workers.engine.scheduler import Scheduler
from workers.engine.stats import EngineStats

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineOptions:
    """Knobs of the built-in engine (the composition root fills these from its settings)."""

    #: ``auto`` picks ``cuda`` when torch sees a GPU, else ``cpu``
    device: str = "auto"
    #: ``auto`` is float32 on CPU and bfloat16 on CUDA
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: what the KV pool stores and attention computes in; ``auto`` is float16 on CPU (see
    #: :meth:`resolved_kv_dtype`) and the model's dtype elsewhere
    kv_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: size of the device KV pool (the "VRAM" tier) in bytes
    kv_pool_bytes: int = 256 * 2**20
    #: tokens per KV page
    page_size: int = 16
    #: most requests decoding at once
    max_batch: int = 32
    #: most tokens (prefill chunks plus decode tokens) in one forward step
    token_budget: int = 2048
    #: cap on prompt plus output tokens; 0 means the model's ``max_position_embeddings``
    context_length: int = 0
    #: torch intra-op threads of the engine's thread, which runs every forward step; 0 takes
    #: the constructing thread's count. On a CPU shared with other busy processes 1 can beat
    #: more: every multi-threaded kernel waits for its slowest thread, and a descheduled one
    #: stalls it for a whole time slice.
    threads: int = 0

    def resolved(self) -> tuple[torch.device, torch.dtype]:
        """The concrete device and dtype these options ask for."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(device)
        if self.dtype == "auto":
            return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of auto, {', '.join(_DTYPES)}")
        return dev, _DTYPES[self.dtype]

    def resolved_kv_dtype(self) -> torch.dtype:
        """The concrete KV dtype these options ask for.

        On CPU ``auto`` keeps KV in float16 while the model computes in float32, as
        llama.cpp does: a token's KV takes half the bytes, so the pool holds twice the
        tokens, every tier moves half the bytes, and decode attention, which streams the
        whole context each step, ran 23% faster on SmolLM2 (8 sequences of 1k-4.5k tokens).
        The cost is float16's rounding of K and V: SmolLM2's logits moved by at most 0.009
        and 32 greedy tokens after a 2k-token prompt stayed the same. Restored pages are
        still exactly what recomputing writes, but only for an engine that computes them
        the same way: the KV dtype does not say how the KV was computed (a float32 model on
        CPU and a float16 one on CUDA both keep float16 KV, of other bytes), so tier keys
        fold in the compute dtype and device type too (``kvgate.wiring.engine.kv_compute``).
        """
        device, dtype = self.resolved()
        if self.kv_dtype == "auto":
            return torch.float16 if device.type == "cpu" else dtype
        if self.kv_dtype not in _DTYPES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} is not one of auto, {', '.join(_DTYPES)}")
        return _DTYPES[self.kv_dtype]

    def kv_bytes_per_token(self, config: ModelConfig) -> int:
        """Bytes one token's KV takes in the pool of an engine with these options."""
        return config.kv_bytes_per_token(self.resolved_kv_dtype().itemsize)

    def describe(self) -> str:
        """What the engine runs as, for reports: ``float32 on cpu, KV in float16``."""
        device, dtype = self.resolved()
        return f"{_name(dtype)} on {device.type}, KV in {_name(self.resolved_kv_dtype())}"


def _name(dtype: torch.dtype) -> str:
    """``float16`` for ``torch.float16``: the names options, layouts and reports use."""
    return str(dtype).removeprefix("torch.")


class TorchEngine:
    """A torch Llama with paged KV, prefix cache and continuous batching on its own thread."""

    def __init__(
        self,
        config: ModelConfig,
        state_dict: Mapping[str, torch.Tensor],
        options: EngineOptions | None = None,
        *,
        model_id: str = "model",
        offload: KVOffload | None = None,
    ) -> None:
        options = options or EngineOptions()
        if options.max_batch < 1 or options.token_budget < 1:
            raise ValueError("max_batch and token_budget must be at least 1")
        device, dtype = options.resolved()
        kv_dtype = options.resolved_kv_dtype()
        self._threads = options.threads or torch.get_num_threads()
        self.model_id = model_id
        self.options = options
        self.context_length = options.context_length or config.max_position_embeddings
        self.eos_token_ids = tuple(config.eos_token_ids)
        self.vocab_size = config.vocab_size
        self.model = LlamaModel(
            config, state_dict, device=device, dtype=dtype, kv_dtype=kv_dtype, threads=self._threads
        )
        if self.model.single_row is not None:
            log.info("engine %s: %s", model_id, self.model.single_row.describe())
        self.pool = KVPool(
            config,
            pool_bytes=options.kv_pool_bytes,
            page_size=options.page_size,
            dtype=kv_dtype,
            device=device,
        )
        #: the tiers this engine was built with (:class:`NoOffload` when none); whether it
        #: uses them now is :attr:`tiers_attached`
        self.offload = offload or NoOffload()
        self.cache = RadixCache(self.pool)
        self.scheduler = Scheduler(
            self.model,
            self.pool,
            self.cache,
            NoOffload(),
            emit=self._emit,
            max_batch=options.max_batch,
            token_budget=options.token_budget,
            context_length=self.context_length,
            eos_token_ids=self.eos_token_ids,
        )
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[TokenEvent]]] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()  # held while the thread touches scheduler state
        self._wire(self.offload)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"engine-{model_id}", daemon=True)
        self._thread.start()

    # --- the Engine protocol ------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Validate ``request`` now (ValueError says what is wrong; a ``SamplingError``
        names the sampling field) and stream its events."""
        sampler = self._validate(request)
        return self._stream(request, sampler)

    def abort(self, rid: str) -> bool:
        with self._cond:
            if rid not in self._streams:
                return False
            self._inbox.append(("abort", rid))
            self._cond.notify()
        return True

    def flush_cache(self) -> bool:
        with self._step_lock:
            return self.scheduler.flush_cache()

    def load(self) -> EngineLoad:
        with self._cond:
            queued = sum(1 for kind, _ in self._inbox if kind == "add")
        return EngineLoad(
            running=len(self.scheduler.running),
            queued=queued + len(self.scheduler.waiting),
            pool_used_pages=self.pool.used_pages,
            pool_total_pages=self.pool.num_pages,
            cached_pages=self.cache.cached_pages,
            preemptions=self.scheduler.stats.preemptions,
            evicted_pages=self.cache.evicted_pages,
            prefill_seconds=self.scheduler.stats.prefill_seconds,
            prefill_tokens=self.scheduler.stats.prefill_tokens,
        )

    def send_down(self, namespace: str, tier: str) -> SentDown:
        if self.has_tiers and not self.tiers_attached:
            raise ColdStorageUnavailable(
                "this worker's tiers are detached; attach them (PUT /hicache/storage-backend) "
                "before sending pages down"
            )
        return cold_storage.send_down(self.cache, self.offload, self._step_lock, namespace, tier)

    @property
    def has_tiers(self) -> bool:
        return not isinstance(self.offload, NoOffload)

    @property
    def tiers_attached(self) -> bool:
        return self.scheduler.offload is self.offload and self.has_tiers

    def attach_tiers(self, attached: bool) -> bool:
        if attached and not self.has_tiers:
            raise ColdStorageUnavailable(
                "this worker was started without tiers below its device pool"
            )
        # The step lock first: a step holding it takes the condition to emit tokens.
        with self._step_lock, self._cond:
            if self.scheduler.has_work or any(kind == "add" for kind, _ in self._inbox):
                return False
            self._wire(self.offload if attached else NoOffload())
        return True

    # --- extras for the server and tests --------------------------------------------------------
    def stats(self) -> EngineStats:
        """A copy of the counters (prefill/decode tokens and seconds, cache, preemptions)."""
        # No lock: a step can take seconds and /metrics must not wait for it; the counters
        # are plain numbers, at worst one step apart from each other.
        s = self.scheduler.stats
        return replace(s, cached_tokens_by_tier=dict(s.cached_tokens_by_tier))

    def close(self) -> None:
        """Stop the engine thread; requests still streaming end with ``abort``."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        with self._step_lock:
            self.scheduler.abort_all()
        for rid in list(self._streams):  # added but never reached the scheduler
            self._emit(TokenEvent(rid, [], finished=True, finish_reason="abort"))

    # --- internals ------------------------------------------------------------------------------
    def _wire(self, offload: KVOffload) -> None:
        """Have the radix cache and the scheduler use ``offload``. With :class:`NoOffload`
        the cache gets no hook at all: an evicted page is freed, not first copied out to be
        dropped."""
        none = isinstance(offload, NoOffload)
        self.cache.offer = None if none else offload.offer
        self.cache.write_through = offload.write_through
        self.scheduler.offload = offload

    def _validate(self, request: GenerateRequest) -> RequestSampler:
        """Check ``request`` against the model and the pool; its sampler, built here so that
        bad sampling values fail this request now rather than a step it shares."""
        n = len(request.input_ids)
        if n == 0:
            raise ValueError("input_ids is empty: send at least one prompt token")
        if n >= self.context_length:
            raise ValueError(
                f"the prompt has {n} tokens but the context holds {self.context_length}; shorten it"
            )
        if min(request.input_ids) < 0 or max(request.input_ids) >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        pages = -(-(n + 1) // self.pool.page_size)
        if pages > self.pool.num_pages:
            raise ValueError(
                f"the prompt needs {pages} KV pages but the pool holds {self.pool.num_pages}; "
                "shorten it or raise kv_pool_bytes"
            )
        return RequestSampler(
            request.sampling, self.eos_token_ids, self.model.device, vocab_size=self.vocab_size
        )

    async def _stream(
        self, request: GenerateRequest, sampler: RequestSampler
    ) -> AsyncIterator[TokenEvent]:
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        with self._cond:
            if request.rid in self._streams:
                raise ValueError(f"request id {request.rid!r} is already in use")
            self._streams[request.rid] = (asyncio.get_running_loop(), queue)
            self._inbox.append(("add", (request, sampler)))
            self._cond.notify()
        finished = False
        try:
            while not finished:
                event = await queue.get()
                finished = event.finished
                yield event
        finally:
            if not finished:
                self.abort(request.rid)

    def _emit(self, event: TokenEvent) -> None:
        with self._cond:
            target = (
                self._streams.pop(event.rid) if event.finished else self._streams.get(event.rid)
            )
        if target is None:
            return
        loop, queue = target
        # A closed event loop raises RuntimeError: nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, event)

    def _run(self) -> None:
        torch.set_num_threads(self._threads)  # OpenMP's thread count is per calling thread
        while True:
            with self._cond:
                while not self._stopping and not self._inbox and not self.scheduler.has_work:
                    self._cond.wait()
                if self._stopping:
                    return
                commands = list(self._inbox)
                self._inbox.clear()
            with self._step_lock:
                try:
                    for kind, arg in commands:
                        if kind == "add":
                            self._add(*arg)  # type: ignore[misc]
                        else:
                            self.scheduler.abort(arg)  # type: ignore[arg-type]
                    self.scheduler.step()
                except Exception:
                    # A failed step (or abort) leaves batch state unknown: end everything,
                    # keep serving. Requests' own faults end only them (``_add``, ``step``).
                    log.exception("engine step failed; aborting all requests")
                    self.scheduler.abort_all()

    def _add(self, request: GenerateRequest, sampler: RequestSampler) -> None:
        """Queue ``request``; a failure here is this request's alone, so only it ends."""
        try:
            self.scheduler.add(request, sampler)
        except Exception:
            log.exception("queueing request %s failed; ending it", request.rid)
            self._emit(TokenEvent(request.rid, [], finished=True, finish_reason="abort"))
