"""The converted-model cache: a converted load is the GGUF load, bit for bit, and a damaged
or unwritable cache costs speed, never correctness."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvgate.models import cache as model_cache
from kvgate.models.cache import ModelCache
from kvgate.models.registry import weights_fingerprint
from workers.engine.config import ModelConfig
from workers.engine.tokenizer import Tokenizer, load_tokenizer
from workers.engine.weights import StateDict, load_model_weights

TEXT = "Héllo wörld 🙂 <|im_start|>user\n  tabs\tand 12345 numbers<|im_end|>"


@pytest.fixture(scope="module")
def fresh(smollm2_gguf: Path) -> tuple[ModelConfig, StateDict, Tokenizer]:
    """The model as read straight from the GGUF file."""
    config, state = load_model_weights(smollm2_gguf)
    return config, state, load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def digest(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return weights_fingerprint(
        str(smollm2_gguf), tmp_path_factory.mktemp("hashes"), device_type="cpu"
    )


def same_weights(a: tuple[ModelConfig, StateDict], b: tuple[ModelConfig, StateDict]) -> bool:
    return (
        a[0] == b[0]
        and a[1].keys() == b[1].keys()
        and all(a[1][n].dtype == b[1][n].dtype and torch.equal(a[1][n], b[1][n]) for n in a[1])
    )


def same_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    ids = a.encode(TEXT)
    return (
        ids == b.encode(TEXT)
        and a.decode(ids, True) == b.decode(ids, True)
        and a.decode(ids, False) == b.decode(ids, False)
        and (a.special, a.chat_template, a.vocab_size) == (b.special, b.chat_template, b.vocab_size)
    )


def forbid_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any read of the GGUF file fail, so a load can only come from the cache."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(model_cache, "load_model_weights", refuse)
    monkeypatch.setattr(model_cache.Tokenizer, "from_gguf", refuse)


@pytest.mark.slow
def test_second_load_comes_from_the_cache_and_is_identical(
    smollm2_gguf: Path,
    digest: str,
    fresh: tuple[ModelConfig, StateDict, Tokenizer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = ModelCache(tmp_path)
    first = cache.weights(smollm2_gguf, digest), cache.tokenizer(smollm2_gguf, digest)
    assert same_weights(first[0], fresh[:2]) and same_tokenizer(first[1], fresh[2])

    forbid_gguf(monkeypatch)
    again = ModelCache(tmp_path)  # a new process would start from the directory alone
    assert same_weights(again.weights(smollm2_gguf, digest), fresh[:2])
    assert same_tokenizer(again.tokenizer(smollm2_gguf, digest), fresh[2])
    entry = cache.entry(digest)
    assert oct(entry.joinpath("weights").stat().st_mode & 0o777) == "0o755"
    assert oct(entry.joinpath("weights", "model.safetensors").stat().st_mode & 0o777) == "0o644"
    assert not list(entry.glob(".*.tmp")), "no temporary part is left behind"


@pytest.mark.slow
def test_damaged_weights_are_converted_again(
    smollm2_gguf: Path,
    digest: str,
    fresh: tuple[ModelConfig, StateDict, Tokenizer],
    tmp_path: Path,
) -> None:
    cache = ModelCache(tmp_path)
    cache.weights(smollm2_gguf, digest)
    tensors = cache.entry(digest) / "weights" / "model.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-5] ^= 0x40  # one bit of the last tensor: still a valid safetensors file
    tensors.write_bytes(bytes(data))

    assert same_weights(cache.weights(smollm2_gguf, digest), fresh[:2])
    assert tensors.read_bytes() != bytes(data), "the damaged file was replaced"


@pytest.mark.slow
def test_a_part_that_does_not_parse_is_rebuilt(
    smollm2_gguf: Path, digest: str, fresh: tuple[ModelConfig, StateDict, Tokenizer], tmp_path: Path
) -> None:
    cache = ModelCache(tmp_path)
    part = cache.entry(digest) / "tokenizer"
    part.mkdir(parents=True)
    (part / "tokenizer.json").write_text("{not json")  # a writer killed mid-file, say

    assert same_tokenizer(cache.tokenizer(smollm2_gguf, digest), fresh[2])
    assert same_tokenizer(Tokenizer.from_dir(part), fresh[2]), "the part was written again"


@pytest.mark.slow
def test_an_unwritable_cache_still_loads(
    smollm2_gguf: Path, digest: str, fresh: tuple[ModelConfig, StateDict, Tokenizer], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would be")
    cache = ModelCache(blocker)
    assert same_tokenizer(cache.tokenizer(smollm2_gguf, digest), fresh[2])
    assert blocker.is_file()


def test_a_part_published_meanwhile_by_another_process_is_kept(tmp_path: Path) -> None:
    final = tmp_path / "entry" / "weights"
    final.mkdir(parents=True)
    (final / "theirs").write_text("first")
    ModelCache(tmp_path)._publish(final, lambda tmp: (tmp / "ours").write_text("second"))
    assert [p.name for p in final.iterdir()] == ["theirs"]
    assert [p.name for p in final.parent.iterdir()] == ["weights"], "our temporary is gone"


def test_entries_are_named_by_content_digest(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    assert cache.entry("sha256:" + "0f" * 32).name == "v1-" + "0f" * 32
    with pytest.raises(ValueError, match="not a content digest"):
        cache.entry("random:llama-8b@cpu")
