"""``kvgate agent``: run any engine server under the worker agent.

    kvgate agent --model smollm2-135m-instruct --url http://127.0.0.1:30000 -- \\
        kvgate worker --port 30000

Starts the command after ``--``, waits for ``URL/health``, registers ``URL`` in the worker
registry and heartbeats the engine's load. On SIGTERM or Ctrl-C it deregisters, waits for
in-flight requests to finish (the gateways stop routing here at their next registry
refresh), and only then stops the engine. Works for the built-in worker and for any
server with SGLang's ``/health`` and ``/v1/loads``; ``kvgate worker-sglang`` uses the same
machinery for SGLang.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from urllib.parse import urlsplit

import click

from kvgate.settings import load_settings
from kvgate.wiring.database import settings_database
from workers.agent import AgentConfig
from workers.sglang.launcher import EngineProcessSpec, serve_with_agent


@click.command("agent")
@click.option("--url", required=True, help="Where the engine answers (probed by the agent).")
@click.option("--model", required=True, help="Model id the engine serves (gateways route by it).")
@click.option("--capacity", type=int, default=16, show_default=True, help="Requests at once.")
@click.option("--worker-id", default=None, help="Registry id [default: HOSTNAME-PORT].")
@click.option("--advertise-url", default=None, help="URL gateways call [default: --url].")
@click.option("--heartbeat", type=float, default=1.0, show_default=True, help="Seconds.")
@click.option(
    "--drain-quiet",
    type=float,
    default=3.0,
    show_default=True,
    help="Seconds the engine must stay idle after deregistering before it is stopped.",
)
@click.option("--drain-timeout", type=float, default=120.0, show_default=True)
@click.option("--start-timeout", type=float, default=900.0, show_default=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def agent(
    url: str,
    model: str,
    capacity: int,
    worker_id: str | None,
    advertise_url: str | None,
    heartbeat: float,
    drain_quiet: float,
    drain_timeout: float,
    start_timeout: float,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (an engine server) and keep it in the worker registry while it serves."""
    url = url.rstrip("/")
    config = AgentConfig(
        worker_id=worker_id or f"{socket.gethostname()}-{urlsplit(url).port}",
        engine_url=url,
        advertise_url=advertise_url,
        model=model,
        capacity=capacity,
        heartbeat_interval_s=heartbeat,
        drain_quiet_s=drain_quiet,
        drain_timeout_s=drain_timeout,
    )
    engine = EngineProcessSpec(
        argv=command, env={}, health_url=f"{url}/health", start_timeout_s=start_timeout
    )
    with settings_database(load_settings()) as dsn:
        sys.exit(asyncio.run(serve_with_agent(engine, config, dsn)))
