"""Loading a model and running the built-in engine, from settings: shared by `kvgate worker`
and `kvgate bench engine` so that the benchmark measures exactly what the worker serves."""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kvgate.models.cache import ModelCache
from kvgate.models.registry import DEFAULT_MODEL, ensure_model, served_model_id, weights_fingerprint
from kvgate.settings import Settings, load_settings
from kvgate.wiring.tiering import tiered_offload
from tiering.keys import compute_tag
from workers.context import ChatTemplate, TextTokenizer
from workers.engine.chat_template import ChatTemplate as Template
from workers.engine.config import ModelConfig
from workers.engine.engine import EngineOptions, TorchEngine
from workers.engine.heap import keep_freed_memory
from workers.engine.kv_pool import KVLayout
from workers.engine.tokenizer import Tokenizer, load_tokenizer
from workers.engine.weights import is_random_spec, load_model_weights

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    """Which model to serve and how to size the engine."""

    #: GGUF file, safetensors directory, ``tiny-random``, ``random:<preset>``, or None for
    #: the default model
    model: str | None
    models_dir: Path
    engine: EngineOptions
    #: tokenizer of a random model (GGUF file or tokenizer directory); None: SmolLM2's
    tokenizer: Path | None = None


def worker_options(settings: Settings | None = None, **overrides: Any) -> WorkerOptions:
    """Options from ``settings`` (read from the environment when None); ``overrides`` that are
    not None win (command-line flags: ``model``, ``kv_pool_bytes``, ``page_size``, ...)."""
    s = settings or load_settings()
    given = {k: v for k, v in overrides.items() if v is not None}
    engine = EngineOptions(
        device=given.pop("device", s.worker_device),
        dtype=given.pop("dtype", s.worker_dtype),
        kv_dtype=given.pop("kv_dtype", s.worker_kv_dtype),
        kv_pool_bytes=given.pop("kv_pool_bytes", s.worker_kv_pool_bytes),
        page_size=given.pop("page_size", s.worker_page_size),
        max_batch=given.pop("max_batch", s.worker_max_batch),
        token_budget=given.pop("token_budget", s.worker_token_budget),
    )
    model = given.pop("model", s.worker_model)
    tokenizer = given.pop("tokenizer", s.worker_tokenizer)
    if given:
        raise TypeError(f"unknown worker options: {', '.join(sorted(given))}")
    return WorkerOptions(model=model, models_dir=s.models_dir, engine=engine, tokenizer=tokenizer)


@dataclass
class LoadedModel:
    """Weights plus the text tools that go with them."""

    model_id: str
    #: identifies the weights themselves; KV pages are keyed by it (see weights_fingerprint)
    fingerprint: str
    config: ModelConfig
    state: dict[str, torch.Tensor]
    tokenizer: TextTokenizer
    chat_template: ChatTemplate


#: seconds a thread may hold the GIL while another waits for it (Python's default: 0.005)
SWITCH_INTERVAL_S = 0.0005


def serving_process(options: WorkerOptions) -> WorkerOptions:
    """Set this process up to serve with the engine; call it before any torch work.

    The allocator keeps what a step frees for the next one
    (:func:`workers.engine.heap.keep_freed_memory`), the engine's thread gets the cores
    (:func:`cores_to_the_engine`) and the GIL changes hands within
    :data:`SWITCH_INTERVAL_S`; returns ``options`` with the engine's thread count.

    The engine's thread gives up the GIL in every torch op and compiled kernel, a few
    hundred times a decode step, and wants it back when the op returns. Meanwhile the event
    loop's thread (HTTP, SSE, detokenizing every token) takes it, and at Python's default
    keeps it up to 5 ms: on a 2-core EPYC, 100 page copies for the lower tiers took 1 s
    beside a busy Python thread at the default interval and 72 ms at 0.5 ms, and two
    serving workers asked in alternation decoded at a median 20.8 ms a token at 0.5 ms
    against 23.3 at 5 ms (sampled: the event loop's thread held the GIL more often than
    the engine's).
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if not keep_freed_memory():
        log.warning(
            "allocator settings not applied (a C library other than glibc?): "
            "each engine step faults its memory in afresh"
        )
    return cores_to_the_engine(options)


def cores_to_the_engine(options: WorkerOptions) -> WorkerOptions:
    """Leave the calling thread one torch thread and give the engine's thread the rest.

    Call it before any torch work in a process that serves (model loading included).
    OpenMP keeps a team of threads for each thread that runs parallel torch code, and a
    team once made stays. Loading on the main thread with every core left a second team
    beside the engine's; with more OpenMP threads than cores, libgomp stops spinning
    between parallel regions, so each of a decode step's ~450 regions waited for a
    wake-up. A SmolLM2 decode step at batch 1 took 45 ms instead of 32 on 2 cores.
    """
    threads = options.engine.threads or torch.get_num_threads()
    torch.set_num_threads(1)
    return replace(options, engine=replace(options.engine, threads=threads))


def load_model(options: WorkerOptions) -> LoadedModel:
    """Load the weights, tokenizer and chat template ``options.model`` names.

    Random models have SmolLM2's vocabulary, so they borrow SmolLM2's tokenizer and template
    (or ``options.tokenizer``'s); they are made on the engine's device in its dtype.
    """
    spec = options.model
    device, dtype = options.engine.resolved()
    weights: str | Path
    if spec is None:
        text_source = weights = ensure_model(options.models_dir, DEFAULT_MODEL)
    elif is_random_spec(spec):
        text_source = options.tokenizer or ensure_model(options.models_dir, DEFAULT_MODEL)
        weights = spec
    else:
        text_source = weights = Path(spec)
    device_type = torch.device(device).type
    hashes = options.models_dir / "fingerprints"
    fingerprint = weights_fingerprint(spec, hashes, device_type=device_type)
    cache = ModelCache(options.models_dir / "converted")
    if _is_gguf(weights):
        config, state = cache.weights(Path(weights), fingerprint)
    else:
        config, state = load_model_weights(weights, device=device, dtype=dtype)
    if _is_gguf(text_source):
        digest = (
            fingerprint
            if text_source == weights
            else weights_fingerprint(str(text_source), hashes, device_type=device_type)
        )
        tokenizer = cache.tokenizer(Path(text_source), digest)
    else:
        tokenizer = load_tokenizer(text_source)
    return LoadedModel(
        served_model_id(spec), fingerprint, config, state, tokenizer, chat_template_of(tokenizer)
    )


def _is_gguf(source: str | Path) -> bool:
    """Whether ``source`` names a GGUF file (those load through the :class:`ModelCache`)."""
    return not is_random_spec(source) and Path(source).suffix == ".gguf" and Path(source).is_file()


def chat_template_of(tokenizer: Tokenizer) -> ChatTemplate:
    """The chat template shipped with the tokenizer, as the server calls it."""
    source = tokenizer.chat_template
    if source is None:  # one that refuses every conversation
        source = "{{ raise_exception('this model has no chat template; use /v1/completions') }}"
    special = tokenizer.special
    return Template(source, bos_token=special.bos, eos_token=special.eos)


def kv_layout(config: ModelConfig, options: EngineOptions) -> KVLayout:
    """The page layout of the pool an engine with ``options`` allocates (tier keys fold it in)."""
    return KVLayout(
        dtype=str(options.resolved_kv_dtype()).removeprefix("torch."),
        page_size=options.page_size,
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )


def kv_compute(options: EngineOptions) -> str:
    """How an engine with ``options`` computes its KV: compute dtype and device type
    (``float32@cpu``); tier keys fold it in.

    The KV dtype alone does not say it: a float32 model on CPU and a float16 one on CUDA
    both keep float16 KV, but of other bytes, and each must restore only what it would
    recompute itself.
    """
    device, dtype = options.resolved()
    return compute_tag(str(dtype).removeprefix("torch."), torch.device(device).type)


@contextlib.contextmanager
def running_engine(
    loaded: LoadedModel,
    options: WorkerOptions,
    tiers: Settings | None = None,
    *,
    lower_tiers: Collection[str] | None = None,
) -> Iterator[TorchEngine]:
    """An engine serving ``loaded``, stopped on exit.

    With ``tiers`` (the settings naming host RAM budget, NAS, S3 and Postgres), pages the
    engine evicts go down the tier ladder and come back on a prefix hit; without, they are
    dropped. ``lower_tiers`` picks which tiers (host is always one; default: those the
    settings configure). The tiers close after the engine, so queued write-behind lands.
    """
    engine: TorchEngine | None = None

    def prefill_stats() -> tuple[int, float]:
        # Called on the engine thread mid-step, so it reads the counters without their lock.
        stats = engine.scheduler.stats if engine is not None else None
        return (stats.prefill_tokens, stats.prefill_seconds) if stats else (0, 0.0)

    offload = None
    if tiers is not None:
        dsn = tiers.database_url.get_secret_value() if tiers.database_url else None
        offload = tiered_offload(
            tiers,
            dsn,
            tiers=lower_tiers,
            model_fingerprint=loaded.fingerprint,
            layout=kv_layout(loaded.config, options.engine),
            compute=kv_compute(options.engine),
            prefill_stats=prefill_stats,
        )
    try:
        engine = TorchEngine(
            loaded.config, loaded.state, options.engine, model_id=loaded.model_id, offload=offload
        )
        # Everything alive now (torch, the model, the libraries: ~170k objects) lives as long
        # as the process. Left to the collector, each full collection rescans it all: a
        # 35-40 ms pause of the scheduler thread at random, under load. Collect once, then
        # move the survivors out of the collector's sight.
        gc.collect()
        gc.freeze()
        try:
            yield engine
        finally:
            engine.close()
            gc.unfreeze()  # back in the collector's sight, for an orderly interpreter exit
    finally:
        if offload is not None:
            offload.close()
