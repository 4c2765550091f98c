"""Building a native library: compiled for this CPU on first use, and cached.

A :class:`Library`'s C files are compiled together with the system's C compiler (``$CC``,
else ``cc``) into ``$XDG_CACHE_HOME/kvgate/native`` (``~/.cache`` by default), named by the
digest of the sources and their headers, the flags, the compiler's version and the CPU's
model and flags, so that a cached library is only ever loaded on the machine kind it was
built for. A build is written to a temporary file and renamed, so processes starting
together never load half a file. The engine's kernels (:mod:`workers.engine.native`) and
the NAS's page reader (:mod:`tiering.native`) are both built here.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: seconds a build may take (it takes well under one)
BUILD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Library:
    """What one shared library is built from."""

    #: the start of the built file's name
    stem: str
    sources: tuple[Path, ...]
    #: included by the sources: part of a build's digest, not compiled on their own
    headers: tuple[Path, ...] = ()
    flags: tuple[str, ...] = ("-O2", "-shared", "-fPIC", "-std=c11")
    libs: tuple[str, ...] = ()


def cache_dir() -> Path:
    """Where builds are kept: ``$XDG_CACHE_HOME/kvgate/native``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvgate" / "native"


def _compiler() -> str:
    cc = os.environ.get("CC") or "cc"
    found = shutil.which(cc)
    if found is None:
        raise RuntimeError(f"no C compiler ({cc!r} is not on PATH)")
    return found


def _cpu_identity() -> str:
    """The CPU model and feature flags (what ``-march=native`` compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def built(library: Library, directory: Path) -> Path:
    """``library`` built for this compiler and CPU under ``directory``, built if missing."""
    cc = _compiler()
    version = subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    ).stdout
    digest = hashlib.sha256()
    for part in (
        *(src.read_bytes() for src in (*library.sources, *library.headers)),
        " ".join(library.flags).encode(),
        version.encode(),
    ):
        digest.update(part)
    digest.update(_cpu_identity().encode())
    target = directory / f"{library.stem}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{library.stem}-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *library.flags, *map(str, library.sources), "-o", tmp, *library.libs],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
