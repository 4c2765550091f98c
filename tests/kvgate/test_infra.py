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


def pods() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Each workload's pod template as (its metadata, its spec)."""
    for doc in documents():
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec:
            yield spec["template"]["metadata"], spec["template"]["spec"]


def config_map() -> dict[str, str]:
    (cm,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    return cm["data"]


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


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
        image, _, _tag = container["image"].partition(":")
        assert image in dockerfiles, container["image"]
        assert (INFRA / dockerfiles[image]).exists()
        assert container["args"][0] in COMMANDS, container["args"]
        # every word up to the first option names a command or subcommand that exists
        words = list(itertools.takewhile(lambda a: not a.startswith("-"), container["args"]))
        command: click.Command = cli
        for word in words:
            assert isinstance(command, click.Group), container["args"]
            found = command.get_command(click.Context(command), word)
            assert found is not None, f"{container['name']}: no command {word!r}"
            command = found
        # and every option before a bare `--` (what follows it goes to SGLang) is one of its
        # options, so a misspelt or removed option fails here, not at the pod's start
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        for arg in itertools.takewhile(lambda a: a != "--", container["args"][len(words) :]):
            if arg.startswith("-"):
                assert arg.partition("=")[0] in options, f"{container['name']}: {arg}"


def test_images_carry_the_project_version_as_their_tag() -> None:
    """Manifests and kustomization.yaml name one fixed tag, the version being released (never
    ``latest`` or none), so a rollout runs the images built from this checkout."""
    version = project_version()
    for _, pod in pods():
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["image"].partition(":")[2] == version, container["name"]
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    assert {i["name"]: i["newTag"] for i in kustomization["images"]} == {
        "kvgate": version,
        "kvgate-sglang": version,
    }


#: the ports each command serves, by the setting that names them: the API (gateway,
#: worker) and tierd's Prometheus metrics; migrate and billing report serve nothing
SERVED_PORTS = {
    "gateway": {"http": "KVGATE_GATEWAY_PORT"},
    "worker-sglang": {"http": "KVGATE_WORKER_PORT"},
    "tierd": {"metrics": "KVGATE_TIERD_METRICS_PORT"},
    "migrate": {},
    "billing": {},
}


def test_probes_hit_the_port_the_container_serves_and_the_settings_name() -> None:
    data = config_map()
    for container in containers():
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            if kind in container:
                assert container[kind]["httpGet"]["port"] in ports, (container["name"], kind)
        expected = SERVED_PORTS[container["args"][0]]
        assert ports == {name: int(data[env]) for name, env in expected.items()}, container["name"]


def test_prometheus_scrapes_each_pod_on_the_port_its_metrics_are_served() -> None:
    """gateway and worker serve /metrics on their API port (SGLang's own, with
    --enable-metrics), tierd on KVGATE_TIERD_METRICS_PORT; the jobs serve none."""
    data = config_map()
    metrics_port = {
        "gateway": data["KVGATE_GATEWAY_PORT"],
        "worker-sglang": data["KVGATE_WORKER_PORT"],
        "tierd": data["KVGATE_TIERD_METRICS_PORT"],
    }
    assert "KVGATE_TIERD_METRICS_PORT" in SETTINGS_ENV
    seen = set()
    for meta, pod in pods():
        (container,) = pod["containers"]
        command = container["args"][0]
        annotations = meta.get("annotations", {})
        if command not in metrics_port:
            assert "prometheus.io/scrape" not in annotations, container["name"]
            continue
        seen.add(command)
        assert annotations["prometheus.io/scrape"] == "true", command
        assert annotations["prometheus.io/path"] == "/metrics", command
        assert annotations["prometheus.io/port"] == metrics_port[command], command
        served = {str(p["containerPort"]) for p in container["ports"]}
        assert annotations["prometheus.io/port"] in served, command
    assert seen == set(metrics_port)


def image_user(dockerfile: str) -> tuple[int, int]:
    """The numeric ``USER uid:gid`` an image runs as, checked to be the user it creates."""
    text = (INFRA / dockerfile).read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.MULTILINE)
    uid, gid = int(user[0]), int(user[1])
    assert re.search(rf"groupadd [^\n]*--gid {gid} ", text), dockerfile
    assert re.search(rf"useradd [^\n]*--uid {uid} --gid {gid} ", text), dockerfile
    return uid, gid


def test_pods_run_as_the_user_the_images_create() -> None:
    """runAsUser/runAsGroup/fsGroup are the numeric user both Dockerfiles create and switch
    to, so the volumes they own are the ones the process writes."""
    uid, gid = image_user("Dockerfile")
    assert image_user("Dockerfile.sglang") == (uid, gid)
    for _, pod in pods():
        context = pod["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid, gid)
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid), container["name"]


def test_every_path_a_container_writes_is_a_volume() -> None:
    """With a read-only root filesystem, KVGATE_HOME (also the images' HOME: the weights'
    fingerprints, kernel caches) and /tmp must be volumes of the pod's own."""
    home = config_map()["KVGATE_HOME"]
    for name in ("Dockerfile", "Dockerfile.sglang"):
        text = (INFRA / name).read_text()
        assert re.search(rf"^ENV .*\bKVGATE_HOME={home}\b.*\bHOME={home}\b", text, re.M), name
    for _, pod in pods():
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            for path in (home, "/tmp"):
                assert mounts.get(path) in empty_dirs, (container["name"], path)


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
