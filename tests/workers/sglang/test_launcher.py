"""``kvgate worker --engine sglang`` without --dry-run: start, register, drain, stop.

SGLang needs a GPU, so ``KVGATE_SGLANG_PYTHON`` points at a stand-in interpreter: a script
that records the command line and environment it was given, then serves on the port the
command asked for with the built-in worker (which answers the same /health and /v1/loads
as SGLang). Everything around it is real: the launcher, the agent, the registry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx

from kvgate.models.registry import content_fingerprint
from kvgate.stack.ports import free_port
from kvgate.stack.seaweed import S3Endpoint
from protocol import registry
from tests.support.gateway import apoll, unique
from tiering.sglang.options import SGLangBackendOptions

STAND_IN = """#!{python}
# Stand-in for `python -m sglang.launch_server ...` (see the test module's docstring).
import json, os, sys
args = sys.argv[1:]
names = ["CUDA_VISIBLE_DEVICES", "DATABASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
with open(os.environ["SGLANG_STAND_IN_RECORD"], "w") as f:
    json.dump({{"argv": args, "env": {{k: os.environ.get(k) for k in names}}}}, f)
port = args[args.index("--port") + 1]
main = "from kvgate.cli import main; main()"
os.execv(sys.executable, [sys.executable, "-c", main, "worker", "--model", "tiny-random", "--port", port])
"""


async def _worker(
    pg_pool: asyncpg.Pool, worker_id: str, launcher: subprocess.Popen[bytes] | None = None
) -> registry.WorkerInfo | None:
    if launcher is not None and launcher.poll() is not None:
        raise AssertionError(f"the launcher exited with {launcher.returncode}; see its log")
    rows = await registry.list_healthy(pg_pool, 60)
    return next((w for w in rows if w.worker_id == worker_id), None)


async def test_launcher_starts_registers_and_drains(
    tmp_path: Path,
    pg_dsn: str,
    pg_pool: asyncpg.Pool,
    s3_server: S3Endpoint,
    smollm2_gguf: Path,
    nas_dir: Path,
) -> None:
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    record = tmp_path / "record.json"
    worker_id, port = unique("w-sglang"), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": pg_dsn,
        "KVGATE_HOME": str(smollm2_gguf.parent.parent),  # tiny-random's tokenizer cache
        "KVGATE_NAS_PATH": str(nas_dir),
        "KVGATE_S3_ENDPOINT": s3_server.url,
        "KVGATE_S3_ACCESS_KEY": s3_server.access_key,
        "KVGATE_S3_SECRET_KEY": s3_server.secret_key,
        "KVGATE_SGLANG_PYTHON": str(stand_in),
        "SGLANG_STAND_IN_RECORD": str(record),
    }
    model = tmp_path / "tiny"  # SGLang is a stand-in: only the launcher reads these files
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    (model / "model.safetensors").write_bytes(b"tiny weights")
    cmd = [sys.executable, "-c", "from kvgate.cli import main; main()", "worker"]
    cmd += ["--engine", "sglang", "--model", str(model), "--served-model-name", "tiny-random"]
    cmd += ["--port", str(port), "--gpu", "3", "--worker-id", worker_id, "--capacity", "6"]
    log = tmp_path / "launcher.log"
    with log.open("wb") as sink:
        launcher = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        row = await apoll(lambda: _worker(pg_pool, worker_id, launcher), bool, 180, "registration")
        assert row.url == f"http://127.0.0.1:{port}"
        assert (row.model, row.capacity) == ("tiny-random", 6)

        seen = json.loads(record.read_text())
        assert seen["argv"][:2] == ["-m", "sglang.launch_server"]
        assert "--enable-hierarchical-cache" in seen["argv"]
        # the backend keys pages by the weights it was handed, hashed before SGLang started
        extra = seen["argv"][seen["argv"].index("--hicache-storage-backend-extra-config") + 1]
        options = SGLangBackendOptions.from_extra_config(json.loads(extra))
        assert options.weights_fingerprint == content_fingerprint(model, tmp_path / "hashes")
        assert seen["env"] == {
            "CUDA_VISIBLE_DEVICES": "3",
            "DATABASE_URL": pg_dsn,
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        }
        assert s3_server.secret_key not in " ".join(seen["argv"])

        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 0, log.read_text()[-3000:]
        assert await _worker(pg_pool, worker_id) is None
        with httpx.Client() as probe:
            try:
                probe.get(f"http://127.0.0.1:{port}/health", timeout=2)
                raise AssertionError("the engine still answers after the launcher exited")
            except httpx.ConnectError:
                pass
    except AssertionError:
        print(log.read_text()[-5000:])  # shown by pytest with the failure
        raise
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
