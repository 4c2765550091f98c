"""infra/k8s/ is what production needs, and what Kubernetes itself would accept.

Every document validates, offline, against the bundled OpenAPI schemas of one pinned
Kubernetes version in strict mode (an unknown field is an error, as `kubectl apply
--validate=strict` makes it). The rest states the production rules as checks over the
parsed manifests: resources, unprivileged pods, the gateway's disruption budget and
autoscaler, who may connect to whom (the NetworkPolicies evaluated as Kubernetes does), who
gets the NAS and the S3 keys, and that every scanner waiver carries its reason.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from pydantic import SecretStr

from kvgate.settings import Settings
from kvgate.settings_doc import env_names

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
#: the Kubernetes version whose schemas the manifests must meet: the oldest minor they are
#: promised to run on (every API they use is GA there); the namespace's Pod Security label
#: names the same minor
K8S_VERSION = "1.30.0"
#: the pods the NetworkPolicies let scrape metrics (documented in infra/README.md)
PROMETHEUS_NAMESPACE = {"kubernetes.io/metadata.name": "monitoring"}
PROMETHEUS_POD = {"app.kubernetes.io/name": "prometheus"}
#: the checks of the scanner (checkov) these manifests waive, each for a reason given in the
#: waiver itself and in infra/README.md: adding one means adding it here too
WAIVED_CHECKS = {"CKV_K8S_8", "CKV_K8S_35", "CKV_K8S_43"}
WAIVER = re.compile(r"^checkov\.io/skip\d+$")
WAIVER_VALUE = re.compile(r"^(CKV2?_K8S_\d+)=(.*)$")


@functools.cache
def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every document of every file kustomization.yaml applies;
    parsed once, so a test that changes a document works on a copy."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [
        (name, doc)
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((K8S / name).read_text())
        if doc
    ]


def documents(kind: str | None = None) -> list[dict[str, Any]]:
    return [doc for _, doc in manifests() if kind is None or doc["kind"] == kind]


def the(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents(kind) if d["metadata"]["name"] == name]
    return doc


def pod_template(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec", {})
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec.get("template")


def workloads() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, its pod template) for every Deployment, StatefulSet, Job and CronJob."""
    for doc in documents():
        template = pod_template(doc)
        if template is not None:
            yield doc, template


def namespace_labels() -> dict[str, str]:
    """The labels of kvgate's namespace, with the one Kubernetes gives every namespace."""
    (namespace,) = documents("Namespace")
    name = namespace["metadata"]["name"]
    return namespace["metadata"]["labels"] | {"kubernetes.io/metadata.name": name}


def component(template: dict[str, Any]) -> str:
    return template["metadata"]["labels"]["app.kubernetes.io/component"]


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod.get("initContainers", []) + pod["containers"]


def quantity(value: str | int) -> Decimal:
    """A Kubernetes resource quantity as a number: ``500m`` is 0.5, ``1Gi`` is 2**30."""
    scale = {"": 1, "m": Decimal("0.001"), "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|)", str(value))
    assert match, f"a quantity this check does not read: {value!r}"
    return Decimal(match[1]) * scale[match[2]]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test: the checks run offline."""

    def refuse(self: socket.socket, address: object) -> None:
        raise AssertionError(f"tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


# --- schemas ---------------------------------------------------------------------------------


def test_the_pinned_version_is_bundled_and_is_the_one_pod_security_names() -> None:
    """kubernetes-validate quietly falls back to an older bundled version for one it lacks;
    the pinned one must be there exactly."""
    assert K8S_VERSION in all_versions()
    (namespace,) = documents("Namespace")
    minor = "v" + K8S_VERSION.rsplit(".", 1)[0]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == minor


@pytest.mark.parametrize(
    "name, doc",
    manifests(),
    ids=[f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in manifests()],
)
def test_every_document_meets_the_kubernetes_schema_strictly(
    name: str, doc: dict[str, Any], no_network: None
) -> None:
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_every_file_holds_only_what_kustomize_applies() -> None:
    """The schema check covers every file: each is listed by kustomization.yaml (itself no
    Kubernetes object) and holds only API objects."""
    listed = {name for name, _ in manifests()}
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert all("apiVersion" in doc and "kind" in doc for doc in documents())


@pytest.mark.parametrize(
    "breakage",
    [
        "a misspelt field",
        "a misspelt field deep in the pod",
        "a field of the wrong type",
        "a missing required field",
    ],
)
def test_the_validator_rejects_a_broken_deployment(breakage: str, no_network: None) -> None:
    """The schema check is no formality: each breakage of the gateway's Deployment that the
    API server would refuse is refused here too."""
    doc = copy.deepcopy(the("Deployment", "kvgate-gateway"))
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # whole, it passes
    container = doc["spec"]["template"]["spec"]["containers"][0]
    if breakage == "a misspelt field":
        doc["spec"]["replica"] = 2
    elif breakage == "a misspelt field deep in the pod":
        container["securityContext"]["readOnlyRootFileSystem"] = True
    elif breakage == "a field of the wrong type":
        container["ports"][0]["containerPort"] = "eight thousand"
    else:
        del doc["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --- resources and privileges ----------------------------------------------------------------


def test_every_container_requests_and_is_limited_in_cpu_and_memory() -> None:
    for workload, template in workloads():
        for container in all_containers(template["spec"]):
            where = f"{workload['metadata']['name']}/{container['name']}"
            resources = container["resources"]
            for resource in ("cpu", "memory"):
                request = quantity(resources["requests"][resource])
                limit = quantity(resources["limits"][resource])
                assert 0 < request <= limit, (where, resource)


def test_only_the_worker_asks_for_a_gpu_and_for_exactly_one() -> None:
    for _, template in workloads():
        for container in all_containers(template["spec"]):
            resources = container["resources"]
            gpus = {quantity(resources[kind].get("nvidia.com/gpu", 0)) for kind in resources}
            if container["name"] == "worker":
                assert gpus == {1}, resources
            else:
                assert gpus == {0}, container["name"]


def test_every_pod_runs_unprivileged() -> None:
    """What the namespace's "restricted" Pod Security Standard demands, and more: no root,
    no service account token, a read-only root filesystem, no capabilities."""
    for workload, template in workloads():
        pod = template["spec"]
        name = workload["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] >= 10000, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in all_containers(pod):
            context = container["securityContext"]
            where = f"{name}/{container['name']}"
            assert context["runAsNonRoot"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert not context.get("privileged"), where


def test_everything_lives_in_one_namespace_that_enforces_restricted_pods() -> None:
    (namespace,) = documents("Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for doc in documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], doc["kind"]


# --- the gateway: disruptions and scale ------------------------------------------------------


def test_the_gateway_survives_a_drain_and_scales_on_cpu() -> None:
    deployment = the("Deployment", "kvgate-gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = the("PodDisruptionBudget", "kvgate-gateway")
    autoscaler = the("HorizontalPodAutoscaler", "kvgate-gateway")

    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert autoscaler["apiVersion"] == "autoscaling/v2"
    target = autoscaler["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        "kvgate-gateway",
    )
    # the autoscaler owns the count: a replicas field would undo its choice on each apply
    assert "replicas" not in deployment["spec"]
    low, high = autoscaler["spec"]["minReplicas"], autoscaler["spec"]["maxReplicas"]
    # at least one gateway serves during a drain, and a drain can still evict one
    assert 1 <= budget["spec"]["minAvailable"] < low <= high
    (metric,) = autoscaler["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    # utilisation is a share of the request, so the gateway must request CPU
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert quantity(container["resources"]["requests"]["cpu"]) > 0


# --- who may connect to whom -----------------------------------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector as Kubernetes applies it (matchLabels only: the policies use no
    expressions, and this check refuses to guess at them)."""
    assert "matchExpressions" not in selector, selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def may_connect(
    source_namespace: dict[str, str], source: dict[str, str], target: dict[str, str], port: int
) -> bool:
    """Whether the NetworkPolicies let a pod labelled ``source`` in a namespace labelled
    ``source_namespace`` open ``port`` on a kvgate pod labelled ``target``.

    As Kubernetes decides it: a pod no ingress policy selects takes anything; a selected
    pod takes what one of its policies' rules allows, a rule matching when its ports name
    the port (or it names none) and one of its peers matches the source (or it has none).
    A peer without a namespaceSelector means the policy's own namespace.
    """
    own = namespace_labels()
    policies = [
        p
        for p in documents("NetworkPolicy")
        if "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], target)
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p["port"] == port for p in ports):
                continue
            peers = rule.get("from")
            if peers is None:
                return True
            for peer in peers:
                assert "ipBlock" not in peer, peer
                namespace_selector = peer.get("namespaceSelector")
                if namespace_selector is None:
                    in_namespace = source_namespace == own
                else:
                    in_namespace = selects(namespace_selector, source_namespace)
                if in_namespace and selects(peer.get("podSelector", {}), source):
                    return True
    return False


def test_only_gateways_and_prometheus_reach_workers_and_only_prometheus_tierd() -> None:
    kvgate_namespace = namespace_labels()
    pods = {component(t): t["metadata"]["labels"] for _, t in workloads()}
    sources = {name: (kvgate_namespace, labels) for name, labels in pods.items()}
    sources |= {
        "prometheus": (PROMETHEUS_NAMESPACE, PROMETHEUS_POD),
        "another pod in monitoring": (PROMETHEUS_NAMESPACE, {"app.kubernetes.io/name": "x"}),
        "a prometheus elsewhere": ({"kubernetes.io/metadata.name": "default"}, PROMETHEUS_POD),
        "a pod elsewhere": ({"kubernetes.io/metadata.name": "default"}, {}),
        "an unlabelled pod of ours": (kvgate_namespace, {}),
    }
    allowed = {
        ("gateway", 8000): set(sources),
        ("worker", 30000): {"gateway", "prometheus"},
        ("tierd", 30100): {"prometheus"},
    }
    for (target, port), expected in allowed.items():
        # the ports probed are the ones the containers serve
        (container,) = next(t for _, t in workloads() if component(t) == target)["spec"][
            "containers"
        ]
        assert port in {p["containerPort"] for p in container["ports"]}, target
        reached = {
            s for s, (ns, labels) in sources.items() if may_connect(ns, labels, pods[target], port)
        }
        assert reached == expected, (target, port)
    # nothing else is open: any other port of any pod, and every port of the jobs
    for target, labels in pods.items():
        for port in (22, 5432, 8000, 8080, 30000, 30100):
            if (target, port) in allowed:
                continue
            reached = {s for s, (ns, src) in sources.items() if may_connect(ns, src, labels, port)}
            assert reached == set(), (target, port)


def test_the_default_is_to_refuse_every_connection() -> None:
    deny = [p for p in documents("NetworkPolicy") if p["spec"]["podSelector"] == {}]
    assert [p["spec"] for p in deny] == [{"podSelector": {}, "policyTypes": ["Ingress"]}]


# --- the NAS and the S3 keys -----------------------------------------------------------------


def s3_secret_names() -> set[str]:
    """The S3 credentials among the secret settings."""
    return {
        env_names(name, field)[0]
        for name, field in Settings.model_fields.items()
        if name.startswith("s3_")
        and SecretStr in (field.annotation, *getattr(field.annotation, "__args__", ()))
    }


def secrets_of(container: dict[str, Any]) -> set[str]:
    """Every Secret a container's environment draws on."""
    names = {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            names.add(ref["name"])
    return names


def test_only_workers_and_tierd_get_the_nas_and_the_s3_keys() -> None:
    s3_users, nas_users = set(), set()
    for _, template in workloads():
        pod = template["spec"]
        for container in all_containers(pod):
            assert secrets_of(container) <= {"kvgate-secrets", "kvgate-s3"}, container["name"]
            if "kvgate-s3" in secrets_of(container):
                s3_users.add(component(template))
        claims = {
            v["persistentVolumeClaim"]["claimName"]
            for v in pod.get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        if "kvgate-nas" in claims:
            nas_users.add(component(template))
    assert s3_users == {"worker", "tierd"}
    assert nas_users == {"worker", "tierd"}


def test_the_readme_puts_the_s3_keys_in_a_secret_of_their_own() -> None:
    """The commands that create the two Secrets: kvgate-s3 holds exactly the S3 keys, and
    kvgate-secrets, which every pod reads, none of them."""
    readme = (ROOT / "infra" / "README.md").read_text().replace("\\\n", " ")
    created = {
        name: set(re.findall(r"--from-literal=(\w+)=", line))
        for line in readme.splitlines()
        for name in re.findall(r"kubectl -n kvgate create secret generic ([\w-]+)", line)
    }
    assert s3_secret_names() == {"KVGATE_S3_ACCESS_KEY", "KVGATE_S3_SECRET_KEY"}
    assert created["kvgate-s3"] == s3_secret_names()
    assert not created["kvgate-secrets"] & s3_secret_names()
    assert "DATABASE_URL" in created["kvgate-secrets"]


# --- scanner waivers -------------------------------------------------------------------------


def waivers() -> list[tuple[str, str, str]]:
    """(resource, check id, reason) for every checkov waiver annotation."""
    found = []
    for doc in documents():
        for key, value in doc["metadata"].get("annotations", {}).items():
            if WAIVER.match(key):
                match = WAIVER_VALUE.match(value)
                assert match, f"{doc['metadata']['name']}: {key}: {value!r}"
                found.append((doc["metadata"]["name"], match[1], match[2].strip()))
    return found


def test_every_waiver_names_a_check_and_says_why() -> None:
    found = waivers()
    assert found
    for resource, check, reason in found:
        assert len(reason) >= 20, (resource, check, reason)
    assert {check for _, check, _ in found} == WAIVED_CHECKS
    readme = (ROOT / "infra" / "README.md").read_text()
    for check in WAIVED_CHECKS:
        assert check in readme, check
    # waivers only sit where the scanner reads them: on a workload's own metadata
    for template in (t for _, t in workloads()):
        assert not any(WAIVER.match(k) for k in template["metadata"].get("annotations", {}))


#: checkov in a virtual environment of its own (``make test`` builds it): its pinned
#: dependencies (boto3, packaging, networkx) cannot live beside the project's
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


def _scan(directory: Path) -> dict[str, Any]:
    """checkov's Kubernetes checks over ``directory``, offline, as one JSON report."""
    assert CHECKOV.exists(), f"{CHECKOV} is missing: `make test` installs it"
    argv = [str(CHECKOV), "-d", str(directory), "--framework", "kubernetes"]
    done = subprocess.run(
        [*argv, "--skip-download", "--compact", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: some check failed
    report = json.loads(done.stdout)
    return report[0] if isinstance(report, list) else report


def test_the_security_scan_finds_nothing_but_the_waived_checks() -> None:
    report = _scan(K8S)
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for c in report["results"].get("failed_checks", [])
    ]
    assert failed == [], "\n".join(failed)
    skipped = {c["check_id"] for c in report["results"].get("skipped_checks", [])}
    assert skipped <= WAIVED_CHECKS
    assert report["summary"]["passed"] > 100 and report["summary"]["parsing_errors"] == 0


def test_the_scanner_fails_a_privileged_root_pod(tmp_path: Path) -> None:
    """The scan is real: a pod that runs privileged, as root, without limits fails it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bad"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "securityContext": {"privileged": True}}
            ]
        },
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(pod))
    failed = {c["check_id"] for c in _scan(tmp_path)["results"]["failed_checks"]}
    assert {"CKV_K8S_16", "CKV_K8S_13"} <= failed  # privileged; no memory limit
