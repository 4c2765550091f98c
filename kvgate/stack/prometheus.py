"""The Prometheus of ``kvgate up --monitoring``: the stack's own metrics, with kvgate's alerts.

It scrapes the gateway, the worker and tierd of this stack every few seconds, evaluates the
alert rules production uses (``infra/prometheus/kvgate-rules.yml``), and keeps its data in
``$KVGATE_HOME/prometheus``. The binary is Debian's ``prometheus`` package (as in CI); the
Grafana dashboard in ``infra/grafana/`` reads exactly these series.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from kvgate.settings import Settings
from kvgate.stack.process import LateProcessPart, ProcessPart, http_probe
from kvgate.stack.supervisor import PartError, Ready

#: the alert rules, as shipped in the checkout (``kvgate up`` runs from one)
RULES = Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "kvgate-rules.yml"
#: seconds between scrapes and rule evaluations on a local stack (production: see infra/)
INTERVAL_S = 5
INSTALL_HINT = "install it with: sudo apt-get install -y prometheus"


def scrape_targets(settings: Settings) -> dict[str, str]:
    """Job name -> ``host:port`` of each process of the stack that serves /metrics."""
    host = settings.bind_host
    targets = {
        "gateway": f"{host}:{settings.gateway_port}",
        "worker": f"{host}:{settings.worker_port}",
    }
    if settings.tierd_metrics_port:
        targets["tierd"] = f"{host}:{settings.tierd_metrics_port}"
    return targets


def config(settings: Settings, rules: Path = RULES) -> dict[str, object]:
    """prometheus.yml for this stack."""
    interval = f"{INTERVAL_S}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in scrape_targets(settings).items()
        ],
    }


class PrometheusPart(LateProcessPart):
    """Prometheus on ``bind_host:prometheus_port``, ready when ``/-/ready`` answers."""

    name = "prometheus"

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._settings = settings

    @property
    def url(self) -> str:
        """Where the Prometheus UI and HTTP API answer."""
        return f"http://{self._settings.bind_host}:{self._settings.prometheus_port}"

    def process(self, env: Mapping[str, str]) -> ProcessPart:
        """Write the configuration now, and the command that reads it."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise PartError(f"`kvgate up --monitoring` needs Prometheus; {INSTALL_HINT}")
        s = self._settings
        home = s.home.absolute() / "prometheus"
        home.mkdir(parents=True, exist_ok=True)
        config_file = home / "prometheus.yml"
        config_file.write_text(json.dumps(config(s), indent=2))  # YAML is a superset of JSON
        argv = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address={s.bind_host}:{s.prometheus_port}",
        ]
        return ProcessPart(
            self.name,
            argv,
            probe=http_probe(self.url + "/-/ready", Ready(self.url)),
            log_path=s.home.absolute() / "logs" / "prometheus.log",
            stop_timeout=s.stop_timeout,
        )
