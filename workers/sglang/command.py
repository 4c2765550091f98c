"""The SGLang server command line for one GPU, with our tiers as its HiCache storage.

The defaults are the recommended settings for one 24 GB RTX 4090; ``docs/sglang.md``
gives the reason for each. The command is plain data (an argv list plus the environment
it needs), so that ``--dry-run`` can print it and a test can feed it to SGLang's own
argument parser.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from tiering.sglang.options import SGLangBackendOptions

#: The values SGLang 0.5 accepts for the enumerated HiCache flags.
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
IO_BACKENDS = ("direct", "kernel")


@dataclass(frozen=True)
class SGLangLaunchSpec:
    """Everything that decides the SGLang command line of one worker."""

    model: str
    backend: SGLangBackendOptions
    host: str = "127.0.0.1"
    port: int = 30000
    #: the CUDA device index this worker owns (exported as CUDA_VISIBLE_DEVICES)
    gpu: int = 0
    served_model_name: str | None = None
    #: the Hub commit (or branch, tag) SGLang loads; the launcher pins the commit whose
    #: files it fingerprinted
    revision: str | None = None
    python: str = sys.executable
    page_size: int = 64
    mem_fraction_static: float = 0.85
    #: host (L2) pool in GB per rank; 0 means size it by ``hicache_ratio`` instead
    hicache_size_gb: int = 0
    hicache_ratio: float = 4.0
    hicache_write_policy: str = "write_through"
    hicache_mem_layout: str = "page_first"
    hicache_io_backend: str = "kernel"
    context_length: int | None = None
    max_running_requests: int | None = None
    kv_cache_dtype: str = "auto"
    #: appended verbatim, for flags this spec does not model
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        checks = (
            ("hicache_write_policy", self.hicache_write_policy, WRITE_POLICIES),
            ("hicache_mem_layout", self.hicache_mem_layout, MEM_LAYOUTS),
            ("hicache_io_backend", self.hicache_io_backend, IO_BACKENDS),
        )
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
        if not 0 < self.mem_fraction_static < 1:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if self.hicache_size_gb < 0 or (self.hicache_size_gb == 0 and self.hicache_ratio <= 1):
            # A host pool no larger than the device pool it backs adds nothing (SGLang warns).
            raise ValueError("give hicache_size_gb > 0, or hicache_ratio > 1")

    @property
    def url(self) -> str:
        """Where the server answers once it is up."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def server_args(spec: SGLangLaunchSpec) -> list[str]:
    """The arguments after ``python -m sglang.launch_server``."""
    args = [
        "--model-path", spec.model,
        "--host", spec.host,
        "--port", str(spec.port),
        "--mem-fraction-static", str(spec.mem_fraction_static),
        "--page-size", str(spec.page_size),
        "--kv-cache-dtype", spec.kv_cache_dtype,
        "--enable-hierarchical-cache",
        "--hicache-mem-layout", spec.hicache_mem_layout,
        "--hicache-io-backend", spec.hicache_io_backend,
        "--hicache-write-policy", spec.hicache_write_policy,
        "--hicache-storage-prefetch-policy", "timeout",
        "--hicache-storage-backend", "dynamic",
        "--hicache-storage-backend-extra-config",
        json.dumps(spec.backend.to_extra_config(), separators=(",", ":"), sort_keys=True),
        "--enable-cache-report",
        "--enable-metrics",
    ]  # fmt: skip
    if spec.hicache_size_gb:
        args += ["--hicache-size", str(spec.hicache_size_gb)]
    else:
        args += ["--hicache-ratio", str(spec.hicache_ratio)]
    if spec.served_model_name:
        args += ["--served-model-name", spec.served_model_name]
    if spec.revision:
        args += ["--revision", spec.revision]
    if spec.context_length:
        args += ["--context-length", str(spec.context_length)]
    if spec.max_running_requests:
        args += ["--max-running-requests", str(spec.max_running_requests)]
    return args + list(spec.extra_args)


def build_argv(spec: SGLangLaunchSpec) -> list[str]:
    """The full argv that starts the SGLang server."""
    return [spec.python, "-m", "sglang.launch_server", *server_args(spec)]


def build_env(spec: SGLangLaunchSpec, secrets: Mapping[str, str]) -> dict[str, str]:
    """Variables to add to the SGLang process's environment.

    ``secrets`` (database DSN, S3 credentials, under the names ``tiering.sglang.options``
    defines) go here rather than on the command line, where ``ps`` would show them.
    """
    return {"CUDA_VISIBLE_DEVICES": str(spec.gpu), **secrets}


def format_command(spec: SGLangLaunchSpec) -> str:
    """A copy-pasteable shell line: the non-secret environment, then the argv."""
    return f"CUDA_VISIBLE_DEVICES={spec.gpu} " + shlex.join(build_argv(spec))
