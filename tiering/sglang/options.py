"""What our SGLang storage backend is told, as the JSON SGLang passes it through.

SGLang loads a ``--hicache-storage-backend dynamic`` backend from the JSON object given in
``--hicache-storage-backend-extra-config``: it reads ``backend_name``, ``module_path``,
``class_name`` and ``interface_v1`` itself and hands the whole object to the backend. This
module owns that object's schema on both sides — the launcher writes it
(:meth:`SGLangBackendOptions.to_extra_config`), the backend reads it
(:meth:`SGLangBackendOptions.from_extra_config`) — and stays free of torch and SGLang so
that a dry run can print a launch command on a machine that has neither.

Secrets never travel in the extra config (it is visible in ``ps`` and in SGLang's logs):
the backend reads the Postgres DSN and the S3 credentials from the environment variables
named here, which the launcher sets for the SGLang process.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Import path and class SGLang's ``StorageBackendFactory`` loads.
MODULE_PATH = "tiering.sglang.backend"
CLASS_NAME = "KvgateHiCacheStorage"
BACKEND_NAME = "kvgate"

#: What a weights fingerprint looks like (``kvgate.models.registry.content_fingerprint``).
_CONTENT_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

#: Environment variables the backend reads its secrets from.
DATABASE_URL_ENV = "DATABASE_URL"
S3_ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
S3_SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"

# Keys SGLang itself reads from the extra config (some it pops before we see them).
_SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "tp_lcm_size",
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "hicache_storage_pass_prefix_keys",
    }
)


@dataclass(frozen=True)
class SGLangBackendOptions:
    """Non-secret settings of the backend; every field is a key of the extra config.

    The deadlines bound how long one SGLang call may wait on the tiers: SGLang calls the
    backend synchronously from its prefetch and backup threads, and a slow NAS or S3 must
    cost a miss, never a stalled scheduler.
    """

    nas_path: str
    s3_endpoint: str | None = None
    s3_bucket: str = "kvgate"
    s3_prefix: str = "kv/"
    s3_region: str = "us-east-1"
    #: the served model id (or its path), folded into every key beside the weights
    model: str = ""
    #: content digest of the weights SGLang loads (``sha256:`` and 64 hex digits), computed
    #: by the launcher (``kvgate.wiring.sglang``) and folded into every key: deployments
    #: serving other weights under one name (a rolling upgrade, fine-tune v1 and v2, a file
    #: replaced in place) never restore each other's KV. The backend refuses to start
    #: without one (:meth:`checked_weights_fingerprint`).
    weights_fingerprint: str = ""
    #: the launch's flags that change the KV these weights compute (``--dtype``,
    #: ``--quantization``, ...; see ``kvgate.wiring.sglang.kv_numerics``), folded into
    #: every key beside the weights; empty for SGLang's defaults
    compute: str = ""
    #: bytes of recently stored or fetched pages kept in this process. SGLang's own host
    #: pool already is the L2 and holds these very pages, so by default none are kept:
    #: keeping them would cost a copy on every write and every read for no extra hits
    host_bytes: int = 0
    #: pages waiting for the NAS beyond which new writes are dropped (and counted); each
    #: queued page holds its bytes (8 MiB for an 8B model at 64 tokens), so this bounds RAM
    write_queue_pages: int = 256
    #: hard cap on the NAS's bytes (``KVGATE_TIER_NAS_MAX_BYTES``): pages that would pass
    #: it are not written (:class:`~tiering.write_behind.NasCap`); needs the ledger, and
    #: without one (``DATABASE_URL`` unset or unreachable at start) no cap applies
    nas_max_bytes: int = 0
    #: threads reading NAS files; 0 means one per CPU up to 8 (more threads than CPUs
    #: only fight over them when the NAS answers from its cache). Writes have threads of
    #: their own (:class:`~tiering.tiers.nas.NasConfig`), so reads never wait behind them
    nas_threads: int = 0
    #: seconds one existence query may take before it answers "not present"
    exists_deadline_s: float = 0.5
    #: seconds one batch read may take; pages not read by then are misses
    get_deadline_s: float = 2.0
    #: seconds one batch write may take; pages not written by then are reported failed
    set_deadline_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.nas_path:
            raise ValueError("nas_path is required: the NAS directory shared by all workers")
        for name in ("exists_deadline_s", "get_deadline_s", "set_deadline_s", "write_queue_pages"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("host_bytes", "nas_threads", "nas_max_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")

    def checked_weights_fingerprint(self) -> str:
        """``weights_fingerprint``, when it is a content digest; ValueError saying how to get one.

        Without it pages would be keyed by the model's name alone, and a worker could decode
        on KV another checkpoint computed: a backend that cannot name its weights must not run.
        """
        fp = self.weights_fingerprint
        if not _CONTENT_DIGEST.fullmatch(fp):
            raise ValueError(
                f"weights_fingerprint {fp!r} in --hicache-storage-backend-extra-config is not "
                "'sha256:' and 64 hex digits: the kvgate backend keys KV pages by the content "
                "of the weights. Start SGLang with `kvgate worker --engine sglang`, which "
                "computes it (a --dry-run command only shows where it goes)."
            )
        return fp

    def to_extra_config(self) -> dict[str, Any]:
        """The JSON object for ``--hicache-storage-backend-extra-config``."""
        return {
            "backend_name": BACKEND_NAME,
            "module_path": MODULE_PATH,
            "class_name": CLASS_NAME,
            # 1 selects SGLang's zero-copy path: batch_get_v1/batch_set_v1 on host indices.
            "interface_v1": 1,
            **dataclasses.asdict(self),
        }

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> SGLangBackendOptions:
        """Parse the extra config SGLang handed over; unknown keys are an error that names them."""
        extra = dict(extra or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(extra) - known - _SGLANG_KEYS)
        if unknown:
            raise ValueError(
                f"unknown keys in --hicache-storage-backend-extra-config: {unknown}; "
                f"the kvgate backend accepts {sorted(known)}"
            )
        return cls(**{k: v for k, v in extra.items() if k in known})
