"""GGUF models converted once, then loaded from their conversion.

Reading a GGUF file is slow for what it holds: ``gguf``'s reader parses every metadata
field on open, and SmolLM2's 49k vocabulary and 48k merges are ~100k strings sliced one by
one out of a memory map (2.4 s here, paid again by the tokenizer), then the Q4_1 tensors are
dequantized to fp32. Every worker start paid ~6 s for it: every ``kvgate up``, every
benchmark configuration, every test that starts a worker.

The first load of a file therefore writes what it produced into a directory named by the
file's content digest (the same sha256 that keys its KV pages):

- ``tokenizer/``: the Hugging Face tokenizer files (:meth:`Tokenizer.save_pretrained`);
- ``weights/``: ``config.json`` and ``model.safetensors`` (the very fp32 tensors the
  dequantizer made, so KV computed from a converted load is the KV of a fresh one), and
  ``manifest.json`` with the xxh3 checksum of the tensor file.

Later loads read those (well under a second). Each part is written to a temporary
directory and renamed into place, so a reader sees a whole part or none, and concurrent
first loads (two workers starting together) both succeed. A part that fails its checksum
or does not parse is removed and rebuilt from the GGUF: a cache never serves wrong weights.
A cache that cannot be written (read-only disk, full disk) costs only the speed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import xxhash
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from workers.engine.config import ModelConfig
from workers.engine.tokenizer import Tokenizer
from workers.engine.weights import StateDict, check_state_dict, load_model_weights

log = logging.getLogger(__name__)

#: bumped when what a part holds changes: older conversions are then not read
FORMAT = 1
WEIGHTS_FILE = "model.safetensors"
#: temporary part directories older than this are a dead writer's and are removed
STALE_TMP_S = 3600.0

T = TypeVar("T")


class ModelCache:
    """Conversions of GGUF files under ``root`` (``$KVGATE_HOME/models/converted``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entry(self, fingerprint: str) -> Path:
        """The directory of the file whose content digest is ``fingerprint`` (``sha256:…``)."""
        algorithm, _, digest = fingerprint.partition(":")
        if algorithm != "sha256" or len(digest) != 64:
            raise ValueError(f"not a content digest: {fingerprint!r}")
        return self.root / f"v{FORMAT}-{digest}"

    def tokenizer(self, gguf: Path, fingerprint: str) -> Tokenizer:
        """The tokenizer of ``gguf`` (whose digest is ``fingerprint``), converted once."""
        return self._part(
            self.entry(fingerprint) / "tokenizer",
            read=Tokenizer.from_dir,
            build=lambda: Tokenizer.from_gguf(gguf),
            write=lambda tok, tmp: tok.save_pretrained(tmp),
        )

    def weights(self, gguf: Path, fingerprint: str) -> tuple[ModelConfig, StateDict]:
        """The config and fp32 state dict of ``gguf`` (digest ``fingerprint``), converted once."""
        return self._part(
            self.entry(fingerprint) / "weights",
            read=_read_weights,
            build=lambda: load_model_weights(gguf),
            write=_write_weights,
        )

    def _part(
        self,
        final: Path,
        *,
        read: Callable[[Path], T],
        build: Callable[[], T],
        write: Callable[[T, Path], object],
    ) -> T:
        if final.is_dir():
            try:
                return read(final)
            except Exception as exc:  # tokenizers raises a bare Exception
                # whatever is wrong with a part, converting again gives the right answer
                log.warning("model cache: %s is unusable (%s); converting again", final, exc)
                shutil.rmtree(final, ignore_errors=True)
        value = build()
        try:
            self._publish(final, lambda tmp: write(value, tmp))
        except OSError as exc:
            log.warning("model cache: cannot write %s (%s); the next start converts again", final, exc)  # fmt: skip
        return value

    def _publish(self, final: Path, write: Callable[[Path], object]) -> None:
        """Write a part into a temporary sibling of ``final`` and rename it into place."""
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        try:
            write(tmp)
            # mkdtemp's 0700 would hide the part from other users of a shared models dir
            tmp.chmod(0o755)
            for file in tmp.iterdir():
                file.chmod(0o644)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():
                    raise
                # another process published the same part first: theirs is as good
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale(directory: Path) -> None:
    """Remove temporary parts that dead writers left in ``directory``."""
    cutoff = time.time() - STALE_TMP_S
    for path in directory.glob(".*.tmp"):
        try:
            if path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)
        except FileNotFoundError:
            continue


def _write_weights(converted: tuple[ModelConfig, StateDict], directory: Path) -> None:
    config, state = converted
    data = save_safetensors(state)  # hashed as written, not read back
    (directory / WEIGHTS_FILE).write_bytes(data)
    checksum = xxhash.xxh3_64_hexdigest(data)
    (directory / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    manifest = {"format": FORMAT, "files": {WEIGHTS_FILE: checksum}}
    (directory / "manifest.json").write_text(json.dumps(manifest) + "\n")


def _read_weights(directory: Path) -> tuple[ModelConfig, StateDict]:
    manifest = json.loads((directory / "manifest.json").read_text())
    data = (directory / WEIGHTS_FILE).read_bytes()
    if xxhash.xxh3_64_hexdigest(data) != manifest["files"][WEIGHTS_FILE]:
        raise ValueError(f"{WEIGHTS_FILE} does not match its checksum")
    config = ModelConfig.from_hf_dict(json.loads((directory / "config.json").read_text()))
    state = load_safetensors(data)
    check_state_dict(config, state, str(directory))
    return config, state
