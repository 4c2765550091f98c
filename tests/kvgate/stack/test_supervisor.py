"""The supervisor in-process with real parts: real child processes, real directories."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psutil
import pytest

from kvgate.settings import Settings
from kvgate.stack.parts import (
    ExternalS3Part,
    MigrationsPart,
    NasPart,
    PostgresPart,
    http_service,
    logging_service,
    stack_parts,
)
from kvgate.stack.ports import free_port
from kvgate.stack.process import ProcessPart, http_probe, kvgate_argv
from kvgate.stack.seaweed import S3Endpoint, ensure_bucket
from kvgate.stack.supervisor import PartError, Ready, Stack, StackFailure, StopRequested
from migrations import runner
from tests.support.commands import gone


def _settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", stop_timeout=5.0)


def _http_server(tmp_path: Path, name: str = "web") -> tuple[ProcessPart, int]:
    """A real HTTP child: ``python -m http.server`` serving ``tmp_path``."""
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    argv += ["--directory", str(tmp_path)]
    return http_service(_settings(tmp_path), name, argv, port, "/"), port


def test_parts_start_in_order_report_addresses_and_stop_in_reverse(tmp_path: Path) -> None:
    lines: list[str] = []
    web, port = _http_server(tmp_path)
    stack = Stack([NasPart(tmp_path / "nas"), web], ready_timeout=30, echo=lines.append)
    try:
        env = stack.start()
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
    finally:
        stack.stop()
    assert lines == [
        f"ready  nas  {tmp_path / 'nas'}",
        f"ready  web  http://127.0.0.1:{port}",
        "stopped  web",
        "stopped  nas",
    ]
    assert env == {"KVGATE_NAS_PATH": str(tmp_path / "nas")}
    assert web.pid is not None and not psutil.pid_exists(web.pid)
    log = (tmp_path / "home" / "logs" / "web.log").read_text()
    assert "kvgate up starts" in log and "GET / HTTP" in log


def test_service_without_http_is_ready_at_its_log_line_of_this_run(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    log = settings.home / "logs" / "daemon.log"
    log.parent.mkdir(parents=True)
    log.write_text("daemon: ready from an earlier run\n")  # must not count
    script = (
        "import sys, time; print('warming up'); time.sleep(0.3); "
        "print('daemon: serving 3 shards'); time.sleep(60)"
    )
    part = logging_service(settings, "daemon", [sys.executable, "-c", script], r"^daemon: .*$")
    lines: list[str] = []
    stack = Stack([part], ready_timeout=30, echo=lines.append)
    try:
        stack.start()
    finally:
        stack.stop()
    assert lines == ["ready  daemon  daemon: serving 3 shards", "stopped  daemon"]


def test_child_gets_exports_of_earlier_parts_and_kvgate_home(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    script = (
        "import os, pathlib; pathlib.Path(os.environ['OUT']).write_text("
        "os.environ['KVGATE_NAS_PATH'] + '|' + os.environ['KVGATE_HOME']); "
        "import time; time.sleep(60)"  # stays up: a child that exits counts as failed
    )
    child = ProcessPart(
        "envdump",
        [sys.executable, "-c", script],
        probe=lambda: Ready("done") if out.exists() else None,
        log_path=tmp_path / "envdump.log",
        env={"OUT": str(out), "KVGATE_HOME": "/kv/home"},
    )
    stack = Stack([NasPart(tmp_path / "nas"), child], ready_timeout=30, echo=lambda _: None)
    try:
        stack.start()
    finally:
        stack.stop()
    assert out.read_text() == f"{tmp_path / 'nas'}|/kv/home"


def test_child_that_exits_while_starting_fails_the_stack_naming_it(tmp_path: Path) -> None:
    lines: list[str] = []
    crash = ProcessPart(
        "crasher",
        [sys.executable, "-c", "import sys; print('no config here'); sys.exit(3)"],
        probe=lambda: None,
        log_path=tmp_path / "crasher.log",
    )
    nas = NasPart(tmp_path / "nas")
    stack = Stack([nas, crash], ready_timeout=30, echo=lines.append)
    with pytest.raises(StackFailure) as info:
        stack.start()
    stack.stop()
    assert info.value.part == "crasher"
    assert "exited with code 3" in info.value.cause and "no config here" in info.value.cause
    assert lines == [f"ready  nas  {tmp_path / 'nas'}", "stopped  crasher", "stopped  nas"]


def test_part_that_never_answers_times_out_with_the_last_probe_error(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    silent = ProcessPart(
        "silent",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        probe=http_probe(f"http://127.0.0.1:{port}/", Ready("never")),
        log_path=tmp_path / "silent.log",
        stop_timeout=5.0,
    )
    stack = Stack([silent], ready_timeout=0.5, echo=lambda _: None)
    with pytest.raises(StackFailure, match=r"'silent' failed: not ready after 0s.*ConnectError"):
        stack.start()
    stack.stop()
    assert silent.pid is not None and not psutil.pid_exists(silent.pid)


@pytest.mark.parametrize("own_session", [False, True], ids=["same-group", "own-session"])
def test_child_that_ignores_sigterm_is_killed_with_its_own_children(
    tmp_path: Path, own_session: bool
) -> None:
    """Its children die too, even one in a session of its own (out of the group's reach)."""
    pids = tmp_path / "pids"
    script = (
        "import os, signal, subprocess, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], "
        f"start_new_session={own_session})\n"
        f"pathlib.Path({str(pids)!r}).write_text(f'{{os.getpid()}} {{kid.pid}}')\n"
        "time.sleep(60)\n"
    )
    stubborn = ProcessPart(
        "stubborn",
        [sys.executable, "-c", script],
        probe=lambda: Ready("up") if pids.exists() and " " in pids.read_text() else None,
        log_path=tmp_path / "stubborn.log",
        stop_timeout=0.5,
    )
    stack = Stack([stubborn], ready_timeout=30, echo=lambda _: None)
    try:
        stack.start()
    finally:
        stack.stop()
    for pid in map(int, pids.read_text().split()):
        assert gone(pid), f"process {pid} survived stop()"


def test_stop_requested_while_waiting_stops_started_parts(tmp_path: Path) -> None:
    lines: list[str] = []
    stack = Stack([NasPart(tmp_path / "nas")], ready_timeout=30, echo=lines.append)
    stack.stop_requested.set()
    with pytest.raises(StopRequested):
        stack.start()
    stack.stop()
    assert lines == []


def test_watch_reports_a_part_that_dies_after_it_was_ready(tmp_path: Path) -> None:
    web, _port = _http_server(tmp_path, "dies")
    stack = Stack([web], ready_timeout=30, echo=lambda _: None)
    try:
        stack.start()
        assert web.pid is not None
        psutil.Process(web.pid).kill()
        with pytest.raises(StackFailure, match=r"'dies' failed: process exited with code -9"):
            stack.watch(interval=0.05)
    finally:
        stack.stop()


def test_nas_that_is_a_regular_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "nas"
    path.write_text("not a directory")
    with pytest.raises(PartError, match=r"is not a directory.*KVGATE_NAS_PATH"):
        NasPart(path).start({})


def test_kvgate_argv_runs_this_interpreters_cli() -> None:
    out = subprocess.run(kvgate_argv("up", "--help"), capture_output=True, text=True, check=True)
    assert "Usage: python -m kvgate up" in out.stdout


def test_the_billing_reporter_runs_exactly_when_stripe_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVGATE_STRIPE_SECRET_KEY", raising=False)
    without = stack_parts(_settings(tmp_path))
    assert "billing" not in [p.name for p in without]
    settings = Settings(home=tmp_path / "home", stripe_secret_key="sk_test_kvgate")
    parts = stack_parts(settings)
    assert [p.name for p in parts][-1] == "billing"  # last up, first stopped
    billing = parts[-1]
    assert isinstance(billing, ProcessPart)
    assert billing.argv[-3:] == ["billing", "report", "--every=15"]
    # the command line parses: its options exist
    out = subprocess.run([*billing.argv, "--help"], capture_output=True, text=True, check=True)
    assert "--every MINUTES" in out.stdout


def test_children_get_sigterm_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    supervisor = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from kvgate.stack.supervisor import Ready\n"
        "from kvgate.stack.process import ProcessPart\n"
        f"out = Path({str(pid_file)!r})\n"
        "child = ProcessPart('sleeper', [sys.executable, '-c', 'import time; time.sleep(120)'],\n"
        f"    probe=lambda: Ready('up'), log_path=Path({str(tmp_path / 'sleeper.log')!r}))\n"
        "child.start({})\n"
        "out.write_text(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", supervisor])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert psutil.pid_exists(child)
    finally:
        proc.kill()  # no chance to clean up: the kernel must tell the child
        proc.wait()
    assert gone(child), "the child outlived its SIGKILLed supervisor"


async def test_external_postgres_and_s3_are_probed_migrated_and_exported(
    pg_dsn: str, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    name = f"upext_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = urlunsplit(urlsplit(pg_dsn)._replace(path=f"/{name}"))
    bucket = f"up-{uuid.uuid4().hex[:8]}"
    lines: list[str] = []
    parts = [
        PostgresPart(url, tmp_path / "unused-pg"),
        MigrationsPart(),
        ExternalS3Part(s3_server, bucket),
    ]
    stack = Stack(parts, ready_timeout=30, echo=lines.append)
    try:
        env = await asyncio.to_thread(stack.start)
    finally:
        stack.stop()
    total = len(runner.discover())
    assert lines[:3] == [
        f"ready  postgres  {url}",
        f"ready  migrations  {total} applied ({total} just now)",
        f"ready  s3  {s3_server.url} bucket={bucket}",
    ]
    assert env["DATABASE_URL"] == url and env["KVGATE_S3_BUCKET"] == bucket
    assert env["KVGATE_S3_ENDPOINT"] == s3_server.url
    assert not (tmp_path / "unused-pg").exists(), "an external Postgres needs no local server"
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == total
    finally:
        await conn.close()
    ensure_bucket(s3_server, bucket)  # exists now: idempotent, no error
