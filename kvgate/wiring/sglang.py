"""The weights an SGLang worker will load, found and fingerprinted before it starts.

SGLang's storage backend keys every KV page by the content of the weights, not by the
served name: deployments serving other checkpoints under one name (a rolling upgrade,
fine-tune v1 and v2, a file replaced in place) must never decode on each other's KV. The
launcher computes that fingerprint here (:func:`kvgate.models.registry.content_fingerprint`, as the
built-in worker does), over the files SGLang will load for ``--model-path``:

- a local file (GGUF) or directory: those files;
- a Hugging Face Hub id: the snapshot in the local Hub cache, found the way SGLang finds it
  (``refs/<revision or main>`` names a commit, ``snapshots/<commit>`` holds its files). The
  launch then pins that commit (``--revision``), so SGLang cannot load another one, for
  instance by downloading a newer ``main``.

What cannot be fingerprinted is refused with what to do (:class:`WeightsUnavailable`): a Hub
model not downloaded yet, a snapshot whose shard index names missing files, a directory
without weights. A worker never starts with keys that do not name its weights. The keys
also fold in the launch flags that change what the weights compute (:func:`kv_numerics`).
Torch-free and SGLang-free: the launcher runs where neither is installed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.argv import pop_option
from kvgate.models.registry import WEIGHTS_SUFFIXES, content_fingerprint


class WeightsUnavailable(RuntimeError):
    """The weights SGLang would load cannot be found or hashed; the message says what to do."""


@dataclass(frozen=True)
class SGLangWeights:
    """What SGLang will load, and what identifies it."""

    #: the local file or directory SGLang loads
    path: Path
    #: ``sha256:…`` over the config and weights files (see ``content_fingerprint``)
    fingerprint: str
    #: the Hub commit of the snapshot, which the launch pins; None for a local path
    revision: str | None = None


def resolve_weights(
    model: str, cache_dir: Path, *, revision: str | None = None, hub_cache: Path | None = None
) -> SGLangWeights:
    """Find the files SGLang loads for ``--model-path model`` and fingerprint them.

    ``revision`` is the Hub revision asked for (branch, tag or commit; default ``main``);
    ``hub_cache`` the Hub cache directory (default: huggingface_hub's, from ``HF_HUB_CACHE``
    or ``HF_HOME``, as SGLang reads it); ``cache_dir`` remembers file hashes between starts.
    """
    local = Path(model).expanduser()
    if local.exists():
        path, commit = local, None
    else:
        path, commit = _hub_snapshot(model, revision, hub_cache or _default_hub_cache())
    if path.is_dir():
        _check_shards(path, model)
    try:
        fingerprint = content_fingerprint(path, cache_dir)
    except (OSError, ValueError) as exc:
        raise WeightsUnavailable(
            f"cannot fingerprint the weights of {model} ({path}): {exc}. KV pages are keyed "
            "by the weights' content, so the worker does not start without it."
        ) from exc
    return SGLangWeights(path, fingerprint, commit)


#: SGLang flags that change the KV the same weights compute: the compute dtype, weight
#: quantization (``--quantization``, ModelOpt's), the KV scales of an FP8 cache, and
#: overrides of the model's config (RoPE scaling, for one). The KV dtype is folded in by the
#: backend itself, from the host pool.
KV_NUMERICS_FLAGS = (
    "--dtype",
    "--quantization",
    "--modelopt-quant",
    "--quantization-param-path",
    "--json-model-override-args",
)


def kv_numerics(args: Sequence[str]) -> str:
    """What SGLang's pass-through ``args`` set of :data:`KV_NUMERICS_FLAGS`, canonically
    (``--dtype=float16;--quantization=fp8``); empty when they leave SGLang's defaults.

    Folded into the backend's keys, so workers launched with other values never restore
    each other's pages. A file given to ``--quantization-param-path`` counts by its content.
    """
    parts = []
    for flag in KV_NUMERICS_FLAGS:
        value, _ = pop_option(args, flag)
        if value is None:
            continue
        if flag == "--quantization-param-path":
            value = _file_digest(Path(value).expanduser())
        parts.append(f"{flag}={value}")
    return ";".join(parts)


def _file_digest(path: Path) -> str:
    """``sha256:…`` of the file at ``path``; WeightsUnavailable when it cannot be read."""
    try:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise WeightsUnavailable(
            f"cannot read --quantization-param-path {path}: {exc}. Its KV scales change the "
            "KV the worker computes, so its pages are keyed by them."
        ) from exc


def split_revision(args: Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    """The value of a ``--revision`` among SGLang's pass-through ``args``, and the rest.

    The launch replaces it with the commit it resolves to, so SGLang loads what was hashed.
    """
    revision, rest = pop_option(args, "--revision")
    return revision, tuple(rest)


def _default_hub_cache() -> Path:
    from huggingface_hub import constants  # imported late: only a real launch needs it

    return Path(constants.HF_HUB_CACHE)


def _hub_snapshot(repo_id: str, revision: str | None, hub_cache: Path) -> tuple[Path, str]:
    """The cached snapshot directory of ``repo_id`` at ``revision``, and its commit."""
    repo = hub_cache / "--".join(["models", *repo_id.split("/")])
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        at = f" at revision {revision}" if revision else ""
        raise WeightsUnavailable(
            f"{repo_id}{at} is neither a local path nor downloaded to the Hugging Face cache "
            f"({hub_cache}); download it first (`hf download {repo_id}`), or "
            "give --model a local directory. The launcher hashes the weights before SGLang "
            "starts, because KV pages are keyed by them."
        )
    return snapshot, snapshot.name


def _check_shards(path: Path, model: str) -> None:
    """Refuse a directory whose shard index names weights files it lacks.

    A partial download hashes to a digest of its own, but SGLang would fetch the missing
    shards and load weights that digest does not cover. Only the formats present count:
    SGLang loads one, and the index of another (say ``pytorch_model.bin.index.json`` beside
    complete safetensors) is never used.
    """
    for index in sorted(path.glob("*.index.json")):
        suffix = Path(index.name.removesuffix(".index.json")).suffix
        if suffix not in WEIGHTS_SUFFIXES or not any(path.glob(f"*{suffix}")):
            continue
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WeightsUnavailable(f"cannot read the shard index {index}: {exc}") from exc
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise WeightsUnavailable(
                f"the weights of {model} in {path} are incomplete: {index.name} names "
                f"{', '.join(missing)}, which are missing; finish the download first"
            )
