"""infra/ stays true to the code: settings, commands, ports, mounts and packaged folders."""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import SecretStr

from kvgate.cli import COMMANDS, cli
from kvgate.settings import Settings
from kvgate.settings_doc import env_names

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SETTINGS_ENV = {env_names(n, f)[0] for n, f in Settings.model_fields.items()}
#: variables the manifests define for their own use (downward API) or for the tools a pod
#: runs (Hugging Face's cache, shared by ``hf download`` and SGLang), not kvgate settings
POD_ENV = {"POD_NAME", "POD_IP", "HF_HOME"}


def documents() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted((INFRA / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def containers() -> Iterator[dict[str, Any]]:
    for doc in documents():
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        pod = spec.get("template", {}).get("spec", {}) if doc["kind"] != "Pod" else spec
        yield from pod.get("containers", [])


def config_map() -> dict[str, str]:
    (cm,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    return cm["data"]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    files = {p.name for p in (INFRA / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_every_configured_variable_is_a_kvgate_setting_and_no_secret() -> None:
    data = config_map()
    assert set(data) <= SETTINGS_ENV, f"not settings: {sorted(set(data) - SETTINGS_ENV)}"
    secrets = {
        env_names(n, f)[0]
        for n, f in Settings.model_fields.items()
        if SecretStr in (f.annotation, *getattr(f.annotation, "__args__", ()))
    }
    assert not set(data) & secrets, "secrets belong in the Secret kvgate-secrets"
    for container in containers():
        for var in container.get("env", []):
            assert var["name"] in SETTINGS_ENV | POD_ENV, var["name"]


def test_the_secret_instructions_name_every_secret_setting() -> None:
    readme = (INFRA / "README.md").read_text()
    for name, field in Settings.model_fields.items():
        if SecretStr in (field.annotation, *getattr(field.annotation, "__args__", ())):
            assert f"{env_names(name, field)[0]}=" in readme, name


def test_every_container_runs_an_existing_command_from_an_image_we_build() -> None:
    dockerfiles = {"kvgate": "Dockerfile", "kvgate-sglang": "Dockerfile.sglang"}
    for container in containers():
        assert container["image"] in dockerfiles
        assert (INFRA / dockerfiles[container["image"]]).exists()
        assert container["args"][0] in COMMANDS, container["args"]
        # every word up to the first option names a command or subcommand that exists
        words = list(itertools.takewhile(lambda a: not a.startswith("-"), container["args"]))
        command: click.Command = cli
        for word in words:
            assert isinstance(command, click.Group), container["args"]
            found = command.get_command(click.Context(command), word)
            assert found is not None, f"{container['name']}: no command {word!r}"
            command = found


def test_probes_hit_the_port_the_container_serves_and_the_settings_name() -> None:
    data = config_map()
    expected = {
        "gateway": int(data["KVGATE_GATEWAY_PORT"]),
        "worker-sglang": int(data["KVGATE_WORKER_PORT"]),
    }
    for container in containers():
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            if kind in container:
                assert container[kind]["httpGet"]["port"] in ports, (container["name"], kind)
        if container["args"][0] in expected:
            assert ports == {"http": expected[container["args"][0]]}, container["name"]


def test_the_nas_is_mounted_where_the_settings_say_on_every_pod_that_uses_it() -> None:
    nas_path = config_map()["KVGATE_NAS_PATH"]
    users = [c for c in containers() if c["args"][0] in {"tierd", "worker-sglang", "worker"}]
    assert users
    for container in users:
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        assert mounts.get("nas") == nas_path, container["name"]


def test_images_copy_every_package_the_distribution_ships() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    for name in ("Dockerfile", "Dockerfile.sglang"):
        copied = set(re.findall(r"^COPY (\w+) \./\1$", (INFRA / name).read_text(), re.MULTILINE))
        assert copied == packages, (name, sorted(packages ^ copied))
