"""``kvgate up`` end to end, as an operator runs it: a real process with a fresh KVGATE_HOME."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kvgate.stack.ports import free_port
from migrations import runner
from tests.support.commands import kvgate_env
from tests.support.stack import processes_referencing, start_up

STARTUP_DEADLINE_S = 120.0
EXIT_DEADLINE_S = 60.0


def test_up_serves_postgres_and_s3_and_sigint_leaves_nothing_running(home: Path) -> None:
    port, worker_port = free_port(), free_port()
    proc, lines = start_up(home, KVGATE_GATEWAY_PORT=str(port), KVGATE_WORKER_PORT=str(worker_port))
    try:
        pg = lines.wait_for(r"^ready  postgres  ", STARTUP_DEADLINE_S)
        assert str(home / "pg") in pg
        lines.wait_for(r"^ready  migrations  ", STARTUP_DEADLINE_S)
        lines.wait_for(r"^ready  s3  http://127\.0\.0\.1:\d+ bucket=kvgate$", STARTUP_DEADLINE_S)
        lines.wait_for(rf"^ready  nas  {re.escape(str(home / 'nas'))}$", STARTUP_DEADLINE_S)
        lines.wait_for(r"^ready  tierd  tierd: NAS ", STARTUP_DEADLINE_S)
        lines.wait_for(rf"^ready  worker  http://127\.0\.0\.1:{worker_port}$", STARTUP_DEADLINE_S)
        lines.wait_for(rf"^ready  gateway  http://127\.0\.0\.1:{port}$", STARTUP_DEADLINE_S)
        lines.wait_for(r"^stack is up", STARTUP_DEADLINE_S)
        # the worker is in the registry: the gateway lists its model and routes to it
        gateway = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while "tiny-random" not in _model_ids(gateway) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "tiny-random" in _model_ids(gateway)
        reply = httpx.post(
            f"{gateway}/chat/completions",
            json={
                "model": "tiny-random",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        running = " | ".join(processes_referencing(home))
        for process in (
            "bin/postgres",
            "weed server",
            "kvgate agent",
            "kvgate worker",
            "kvgate gateway",
            "kvgate tierd",
        ):
            assert process in running, f"{process} not found among {running}"

        second = subprocess.run(
            [sys.executable, "-m", "kvgate", "up"],
            env=kvgate_env(home),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"another `kvgate up` (pid {proc.pid}) is running on {home}" in second.stderr

        # a second process attaches to the same embedded server
        status = subprocess.run(
            [sys.executable, "-m", "kvgate", "migrate", "--status"],
            env=kvgate_env(home),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        expected = [m.name for m in runner.discover()]
        reported = [line.split()[:2] for line in status.stdout.splitlines()]
        assert reported == [["applied", name] for name in expected]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(EXIT_DEADLINE_S)
    lines.wait_for(r"^stopped  postgres$", EXIT_DEADLINE_S)
    assert code == 0, lines.seen
    assert [ln for ln in lines.seen if ln.startswith("stopped")] == [
        "stopped  gateway",
        "stopped  worker",
        "stopped  tierd",
        "stopped  nas",
        "stopped  s3",
        "stopped  migrations",
        "stopped  postgres",
    ]
    assert processes_referencing(home) == []


def _model_ids(base_url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{base_url}/models", timeout=10).json()["data"]]


def test_failing_part_stops_the_stack_and_is_named(home: Path) -> None:
    home.mkdir()
    not_a_dir = home / "nas-file"
    not_a_dir.write_text("a regular file where the NAS directory should be")
    proc, lines = start_up(home, KVGATE_NAS_PATH=str(not_a_dir))
    code = proc.wait(STARTUP_DEADLINE_S)
    message = lines.wait_for(r"part 'nas' failed", EXIT_DEADLINE_S)
    assert code == 1
    assert "is not a directory" in message and "KVGATE_NAS_PATH" in message
    lines.wait_for(r"^stopped  postgres$", EXIT_DEADLINE_S)
    assert "stopped  s3" in lines.seen
    assert processes_referencing(home) == []


def test_sigterm_during_startup_stops_what_was_started(home: Path) -> None:
    proc, lines = start_up(home)
    lines.wait_for(r"^ready  postgres  ", STARTUP_DEADLINE_S)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(EXIT_DEADLINE_S)
    lines.wait_for(r"^stopped  postgres$", EXIT_DEADLINE_S)
    assert code == 0, lines.seen
    assert processes_referencing(home) == []
