"""The SGLang launch command: printed by --dry-run without SGLang, accepted by SGLang's parser."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgate.cli import cli
from kvgate.cli.worker_sglang import DRY_RUN_WEIGHTS
from tiering.sglang.options import CLASS_NAME, MODULE_PATH, SGLangBackendOptions
from workers.sglang.command import SGLangLaunchSpec

# Parses argv with SGLang's own machinery (ServerArgs.add_cli_args + from_cli_args) and
# prints the fields we rely on. A subprocess, because prepare_server_args reconfigures
# the root logger of whoever calls it.
_PARSE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
a = prepare_server_args(json.loads(sys.argv[1]))
print(json.dumps({k: getattr(a, k) for k in json.loads(sys.argv[2])}))
"""

_FIELDS = [
    "model_path",
    "host",
    "port",
    "page_size",
    "mem_fraction_static",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "hicache_size",
    "hicache_write_policy",
    "hicache_mem_layout",
    "hicache_storage_prefetch_policy",
    "hicache_storage_backend",
    "hicache_storage_backend_extra_config",
    "enable_cache_report",
    "enable_metrics",
    "served_model_name",
    "tp_size",
    "revision",
    "dtype",
]


def _dry_run(tmp_path: Path, *args: str, **settings: str) -> str:
    env = {
        "KVGATE_HOME": str(tmp_path / "home"),
        "KVGATE_CONFIG": str(tmp_path / "none.toml"),
        **settings,
    }
    result = CliRunner().invoke(cli, ["worker", "--engine", "sglang", "--dry-run", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.output.strip()


def _sglang_parse(line: str) -> dict:
    pytest.importorskip("sglang.srt.server_args", reason="run scripts/install-sglang-test-deps.sh")
    argv = shlex.split(line)
    assert argv[0] == "CUDA_VISIBLE_DEVICES=1"
    start = argv.index("sglang.launch_server") + 1
    out = subprocess.run(
        [sys.executable, "-c", _PARSE, json.dumps(argv[start:]), json.dumps(_FIELDS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dry_run_command_is_accepted_by_sglang_parser(tmp_path: Path) -> None:
    line = _dry_run(
        tmp_path,
        "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--gpu", "1",
        "--port", "31000",
        "--served-model-name", "qwen2.5-7b",
        "--hicache-size", "32",
        "--", "--tp-size", "1", "--dtype", "float16",
    )  # fmt: skip
    parsed = _sglang_parse(line)

    assert parsed["model_path"] == "Qwen/Qwen2.5-7B-Instruct"
    assert parsed["port"] == 31000
    assert parsed["served_model_name"] == "qwen2.5-7b"
    assert parsed["enable_hierarchical_cache"] is True
    assert parsed["hicache_size"] == 32
    assert parsed["hicache_write_policy"] == "write_through"
    assert parsed["hicache_mem_layout"] == "page_first"
    assert parsed["hicache_storage_prefetch_policy"] == "timeout"
    assert parsed["page_size"] == 64
    assert parsed["enable_cache_report"] is True
    assert parsed["enable_metrics"] is True
    assert parsed["tp_size"] == 1
    assert parsed["dtype"] == "float16"
    assert parsed["hicache_storage_backend"] == "dynamic"
    extra = json.loads(parsed["hicache_storage_backend_extra_config"])
    assert extra["module_path"] == MODULE_PATH
    assert extra["class_name"] == CLASS_NAME
    assert extra["interface_v1"] == 1
    options = SGLangBackendOptions.from_extra_config(extra)
    assert options == _backend_options(line)
    assert options.model == "qwen2.5-7b"
    assert options.compute == "--dtype=float16"  # SGLang computes in it: the keys say so
    # a dry run hashes nothing, and says so where the fingerprint goes
    assert options.weights_fingerprint == DRY_RUN_WEIGHTS
    assert Path(options.nas_path) == (tmp_path / "home" / "nas").resolve()
    # No secret on the command line: ps and SGLang's logs would show it.
    assert "kvgate-secret" not in line and "postgres" not in line.lower()


def _backend_options(line: str) -> SGLangBackendOptions:
    """The backend options a dry-run command line hands SGLang."""
    argv = shlex.split(line)
    extra = argv[argv.index("--hicache-storage-backend-extra-config") + 1]
    return SGLangBackendOptions.from_extra_config(json.loads(extra))


def test_the_nas_cap_reaches_the_backend(tmp_path: Path) -> None:
    caps = {"KVGATE_TIER_NAS_HIGH_BYTES": "1000", "KVGATE_TIER_NAS_MAX_BYTES": "1200"}
    line = _dry_run(tmp_path, "--model", "m", **caps)
    assert _backend_options(line).nas_max_bytes == 1200
    assert _backend_options(_dry_run(tmp_path, "--model", "m")).nas_max_bytes == 0


def test_flags_that_change_the_kv_are_folded_into_the_keys(tmp_path: Path) -> None:
    assert _backend_options(_dry_run(tmp_path, "--model", "org/m", "--gpu", "1")).compute == ""
    scales = tmp_path / "kv_scales.json"
    scales.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.5}}}}')
    line = _dry_run(
        tmp_path, "--model", "org/m", "--gpu", "1",
        "--", "--quantization=fp8", "--dtype", "bfloat16", "--quantization-param-path", str(scales),
        "--enable-torch-compile",
    )  # fmt: skip
    digest = hashlib.sha256(scales.read_bytes()).hexdigest()
    assert _backend_options(line).compute == (
        f"--dtype=bfloat16;--quantization=fp8;--quantization-param-path=sha256:{digest}"
    )
    # other scales are other KV (the `=` form counts as well)
    scales.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.25}}}}')
    other = hashlib.sha256(scales.read_bytes()).hexdigest()
    line = _dry_run(
        tmp_path, "--model", "org/m", "--gpu", "1", "--", f"--quantization-param-path={scales}"
    )
    assert other != digest
    assert _backend_options(line).compute == f"--quantization-param-path=sha256:{other}"


def test_unreadable_kv_scales_are_refused_with_the_path(tmp_path: Path) -> None:
    env = {"KVGATE_HOME": str(tmp_path / "home"), "KVGATE_CONFIG": str(tmp_path / "none.toml")}
    missing = tmp_path / "no-such-scales.json"
    args = ["--model", "org/m", "--dry-run", "--", "--quantization-param-path", str(missing)]
    result = CliRunner().invoke(cli, ["worker", "--engine", "sglang", *args], env=env)
    assert result.exit_code == 1
    assert str(missing) in result.output and "KV scales" in result.output


def test_a_revision_for_sglang_is_passed_on_once(tmp_path: Path) -> None:
    line = _dry_run(tmp_path, "--model", "org/m", "--gpu", "1", "--", "--revision=v2")
    assert shlex.split(line).count("--revision") == 1
    assert _sglang_parse(line)["revision"] == "v2"


def test_a_model_whose_weights_cannot_be_hashed_is_not_started(tmp_path: Path) -> None:
    # Not a local path, and not in the Hugging Face cache: its pages could not be keyed.
    env = {"KVGATE_HOME": str(tmp_path / "home"), "KVGATE_CONFIG": str(tmp_path / "none.toml")}
    env["KVGATE_SGLANG_PYTHON"] = str(tmp_path / "never-run")
    model = f"kvgate-test/never-downloaded-{uuid.uuid4().hex}"
    result = CliRunner().invoke(cli, ["worker", "--engine", "sglang", "--model", model], env=env)
    assert result.exit_code == 1, result.output
    assert "download it first" in result.output and "starting SGLang" not in result.output


def test_ratio_is_used_when_no_size_given(tmp_path: Path) -> None:
    parsed = _sglang_parse(_dry_run(tmp_path, "--model", "m", "--gpu", "1"))
    assert parsed["hicache_ratio"] == 4.0
    assert parsed["hicache_size"] == 0


@pytest.mark.parametrize(
    ("command", "blocked"),
    [(["worker", "--engine", "sglang"], ["sglang"]), (["worker-sglang"], ["sglang", "torch"])],
)
def test_dry_run_needs_no_sglang(tmp_path: Path, command: list[str], blocked: list[str]) -> None:
    # Importing a blocked module fails in this child: the dry run must not try. (The
    # `worker-sglang` spelling avoids torch too, for a GPU host's launcher-only install.)
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
        "from kvgate.cli import cli\n"
        f"cli({[*command, '--dry-run', '--model', 'some/model']!r})\n"
    )
    env = {"KVGATE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "sglang.launch_server" in out.stdout


def test_bad_settings_are_refused_with_a_reason() -> None:
    backend = SGLangBackendOptions(nas_path="/nas")
    with pytest.raises(ValueError, match="hicache_write_policy"):
        SGLangLaunchSpec(model="m", backend=backend, hicache_write_policy="sometimes")
    with pytest.raises(ValueError, match="hicache_ratio"):
        SGLangLaunchSpec(model="m", backend=backend, hicache_ratio=1.0)
    with pytest.raises(ValueError, match="unknown keys"):
        SGLangBackendOptions.from_extra_config({"nas_path": "/nas", "nas_pth": "/typo"})


def test_unknown_engine_is_refused_by_name() -> None:
    result = CliRunner().invoke(cli, ["worker", "--engine", "vllm"])
    assert result.exit_code == 2
    assert "'vllm' is not one of 'builtin', 'sglang'" in result.output
