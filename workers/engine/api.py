"""The contract between the engine core (scheduler, model, KV) and whoever serves it (HTTP).

The engine works in token ids only. Text concerns (tokenizing, chat templates, stop
strings, detokenizing) belong to the serving layer, which aborts a request once a stop
string appears. Everything here is plain data so that it can cross threads safely.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from workers.engine.grammar import Grammar

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``temperature`` 0 means greedy, and so does any below
    ``sampling.GREEDY_TEMPERATURE`` (1e-5), which float32 cannot divide logits by.

    The engine refuses values it cannot sample with when the request arrives
    (``sampling.check_sampling``): a ValueError naming the field, before the request joins
    a batch.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off; values beyond the vocabulary keep every token, as 0 does
    seed: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    #: None: no log-probabilities; k: each generated token's, with the k most likely
    #: alternatives (at most ``logprobs.MAX_TOP_LOGPROBS``)
    logprobs: int | None = None
    #: what the output must follow (a JSON schema, tool calls), compiled; None: anything
    grammar: Grammar | None = None


@dataclass(frozen=True)
class GenerateRequest:
    """One generation: prompt ids, sampling, and the tenant's cache salt (KV namespace)."""

    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    cache_salt: str = ""


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities at one generated position, under the model's own distribution
    there (the log-softmax of its logits, before temperature, top-k, top-p or any mask)."""

    #: of the token generated at this position
    logprob: float
    #: the most likely tokens there, ``(token id, logprob)``, most likely first
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class TokenEvent:
    """What one scheduler step produced for one request.

    ``token_ids`` holds only the tokens new since the previous event. The last event of a
    request has ``finished`` set (and may carry no token: aborts, or a prompt that left no
    room). When a request ends with ``stop`` on an EOS or stop token id, that id is its last
    token (counted in ``completion_tokens``); hiding it is the serving layer's choice.
    Counters are totals so far.
    """

    rid: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    #: tokens of the prompt served from each tier (keys from :data:`protocol.tiers.TIERS`), summing to ``cached_tokens``
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    #: one per token of ``token_ids`` when the request asked for them, else empty
    logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot for load reporting (/v1/loads, /metrics, the worker agent)."""

    running: int
    queued: int
    pool_used_pages: int
    pool_total_pages: int
    cached_pages: int
    #: requests sent back to the queue to free pages, since start
    preemptions: int = 0
    #: pages the prefix cache evicted to make room (handed to the lower tiers, if any),
    #: since start; a flush does not count
    evicted_pages: int = 0
    #: seconds the engine spent computing prompt tokens, since start (with the prompt tokens
    #: computed, what a recompute costs per token: what a restore must beat)
    prefill_seconds: float = 0.0
    #: prompt tokens the engine computed (not restored), since start
    prefill_tokens: int = 0


@dataclass(frozen=True)
class SentDown:
    """What sending one cache namespace to cold storage did (``Engine.send_down``)."""

    #: ``nas`` or ``object``
    tier: str
    #: pages written to the tier, from the device, host RAM and (for ``object``) the NAS
    pages: int
    #: device pool pages freed once their copies were written
    device_pages: int
    #: device pages left where they are: a running request pins (or extended) them
    pinned_pages: int
    #: host RAM copies dropped
    host_pages: int
    #: NAS copies deleted (sent to the object store)
    nas_pages: int


class Engine(Protocol):
    """What the serving layer needs from an engine."""

    model_id: str
    context_length: int
    eos_token_ids: tuple[int, ...]
    #: width of the model's logits (token ids lie below it)
    vocab_size: int

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Queue ``request`` and yield its events until one has ``finished``.

        Closing the iterator early (client gone) aborts the request and frees its pages.
        """
        ...

    def abort(self, rid: str) -> bool:
        """Stop ``rid`` wherever it is (queued or running); False when unknown."""
        ...

    def flush_cache(self) -> bool:
        """Drop every unreferenced cached page; False when requests are running."""
        ...

    def load(self) -> EngineLoad:
        """Current load."""
        ...

    def send_down(self, namespace: str, tier: str) -> SentDown:
        """Move the cache namespace's pages off the device and host RAM onto ``tier``
        (``nas`` or ``object``), each written there before it leaves a faster tier; pages
        running requests use stay. Blocks (call it off the event loop); raises
        ``tiering.cold_storage.ColdStorageUnavailable`` when the tier is not configured
        or the tiers are detached."""
        ...

    @property
    def has_tiers(self) -> bool:
        """Whether the engine was built with tiers below its device pool."""
        ...

    @property
    def tiers_attached(self) -> bool:
        """Whether it uses them now: offers its pages and restores prefixes from them."""
        ...

    def attach_tiers(self, attached: bool) -> bool:
        """Start (``attached``) or stop using the tiers, as SGLang's HiCache storage backend
        is attached and detached at runtime; False (and nothing changed) unless the engine
        is idle, no request running or queued. Detached, evicted pages are dropped and
        every prefix not in the device pool is recomputed; the tiers keep what they hold.
        Raises ``tiering.cold_storage.ColdStorageUnavailable`` when attaching an engine
        built without tiers."""
        ...
