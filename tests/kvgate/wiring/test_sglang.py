"""What an SGLang worker's pages are keyed by: the content of the files SGLang will load,
found as SGLang finds them (a local path, or a snapshot in the Hugging Face cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvgate.models.registry import content_fingerprint
from kvgate.wiring.sglang import WeightsUnavailable, resolve_weights, split_revision

REPO = "org/tiny"


def _model_dir(path: Path, weights: bytes = b"weights v1") -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"hidden_size": 64}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def _hub_snapshot(hub: Path, commit: str, weights: bytes, ref: str | None = "main") -> Path:
    """A snapshot laid out as huggingface_hub caches it: files are links to blobs."""
    repo = hub / "models--org--tiny"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in {"config.json": b'{"hidden_size": 64}', "model.safetensors": weights}.items():
        blob = blobs / f"{commit}-{name}"
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def test_a_local_directory_is_keyed_by_its_weights_not_its_name(tmp_path: Path) -> None:
    hashes = tmp_path / "hashes"
    v1 = resolve_weights(str(_model_dir(tmp_path / "v1" / "model")), hashes)
    v2 = resolve_weights(str(_model_dir(tmp_path / "v2" / "model", b"weights v2")), hashes)
    copy = resolve_weights(str(_model_dir(tmp_path / "copy")), hashes)
    assert v1.fingerprint.startswith("sha256:") and v1.revision is None
    assert v1.fingerprint != v2.fingerprint  # same directory name, other weights
    assert v1.fingerprint == copy.fingerprint  # other name, same weights


def test_a_gguf_file_is_keyed_by_its_bytes(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"gguf weights")
    got = resolve_weights(str(gguf), tmp_path / "hashes")
    assert got.path == gguf and got.fingerprint == content_fingerprint(gguf, tmp_path / "h2")


@pytest.mark.parametrize("weights", ["model.gguf", "pytorch_model.bin"])
def test_a_directory_of_other_weights_formats_is_keyed_by_them(
    tmp_path: Path, weights: str
) -> None:
    fingerprints = set()
    for version in (b"v1", b"v2"):
        model = tmp_path / version.decode()
        model.mkdir()
        (model / "config.json").write_text('{"hidden_size": 64}')  # the same config
        (model / weights).write_bytes(b"weights " + version)
        fingerprints.add(resolve_weights(str(model), tmp_path / "hashes").fingerprint)
    assert len(fingerprints) == 2


def test_a_hub_id_is_its_cached_snapshot_whose_commit_is_pinned(tmp_path: Path) -> None:
    hub, hashes = tmp_path / "hub", tmp_path / "hashes"
    old = _hub_snapshot(hub, "a" * 40, b"weights v1", ref=None)
    new = _hub_snapshot(hub, "b" * 40, b"weights v2")  # what refs/main names now
    got = resolve_weights(REPO, hashes, hub_cache=hub)
    assert (got.path, got.revision) == (new, "b" * 40)
    assert got.fingerprint == content_fingerprint(new, hashes)
    pinned = resolve_weights(REPO, hashes, revision="a" * 40, hub_cache=hub)
    assert (pinned.path, pinned.revision) == (old, "a" * 40)
    assert pinned.fingerprint != got.fingerprint


def test_weights_that_cannot_be_hashed_are_refused_with_what_to_do(tmp_path: Path) -> None:
    hub, hashes = tmp_path / "hub", tmp_path / "hashes"
    with pytest.raises(WeightsUnavailable, match="hf download org/tiny"):
        resolve_weights(REPO, hashes, hub_cache=hub)
    _hub_snapshot(hub, "c" * 40, b"weights")
    with pytest.raises(WeightsUnavailable, match="at revision v9"):
        resolve_weights(REPO, hashes, revision="v9", hub_cache=hub)

    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    with pytest.raises(WeightsUnavailable, match="holds no weights file"):
        resolve_weights(str(no_weights), hashes)

    partial = _model_dir(tmp_path / "partial")
    index = {"weight_map": {"a": "model.safetensors", "b": "model-2.safetensors"}}
    (partial / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsUnavailable, match=r"model-2\.safetensors, which are missing"):
        resolve_weights(str(partial), hashes)
    # the index of a format that is not there at all is never loaded: no reason to refuse
    (partial / "model.safetensors.index.json").unlink()
    bin_index = {"weight_map": {"a": "pytorch_model.bin"}}
    (partial / "pytorch_model.bin.index.json").write_text(json.dumps(bin_index))
    assert resolve_weights(str(partial), hashes).fingerprint.startswith("sha256:")


def test_a_revision_among_sglang_args_is_split_off() -> None:
    assert split_revision(["--tp-size", "2", "--revision", "v2"]) == ("v2", ("--tp-size", "2"))
    assert split_revision(["--revision=v3", "-x"]) == ("v3", ("-x",))
    assert split_revision(["--tp-size", "2"]) == (None, ("--tp-size", "2"))
