"""Key/value metadata of a GGUF file as plain Python values.

Both the weight loader (hyper-parameters) and the tokenizer (vocabulary, merges, chat
template) read GGUF metadata; this module is the one place that knows how ``gguf``'s
reader stores it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np


class GGUFMetadata:
    """Typed access to the metadata of one GGUF file (read lazily, field by field)."""

    def __init__(self, reader: gguf.GGUFReader, path: Path) -> None:
        self.reader = reader
        self.path = path

    @classmethod
    def open(cls, path: str | Path) -> GGUFMetadata:
        """Open ``path`` read-only (memory-mapped; tensors are not read here)."""
        path = Path(path)
        return cls(gguf.GGUFReader(path), path)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (str, int, float, bool or list), or ``default`` when absent."""
        field = self.reader.get_field(key)
        if field is None:
            return default
        value = field.contents()
        if field.types == [gguf.GGUFValueType.FLOAT32]:
            # The shortest decimal that is this float32 (1e-05, not 9.999999747378752e-06):
            # what the converter was given, and what a config.json says.
            return float(str(np.float32(value)))
        return value

    def require(self, key: str) -> Any:
        """The value of ``key``; ``ValueError`` naming the file and key when it is absent."""
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.path}: GGUF metadata has no {key!r}")
        return value

    @property
    def architecture(self) -> str:
        """``general.architecture`` (e.g. ``llama``), the prefix of the model's own keys."""
        return str(self.require("general.architecture"))
