"""kvgate's alert rules: valid for Prometheus, and each one unit-tested both ways with promtool.

``promtool`` comes from Debian's ``prometheus`` package, which ``.ci/run`` installs; this
test fails (never skips) without it, naming the command that installs it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvgate.stack.prometheus import INSTALL_HINT, RULES

TESTS = RULES.with_name("kvgate-rules.test.yml")


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path is not None, f"promtool is missing; {INSTALL_HINT}"
    return path


def _run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, cwd=RULES.parent, timeout=120
    )


def alert_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_the_rules_are_valid(promtool: str) -> None:
    done = _run(promtool, "check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_expect(promtool: str) -> None:
    cases = [
        case
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert fires == alert_names(), "alerts without a case that fires them"
    assert quiet == alert_names(), "alerts without a case that must not fire them"
    done = _run(promtool, "test", "rules", TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_expectation_fails_promtool(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: expecting the quiet case to fire is caught."""
    shutil.copy(RULES, tmp_path / RULES.name)
    tests = yaml.safe_load(TESTS.read_text())
    quiet = next(t for t in tests["tests"] for c in t["alert_rule_test"] if not c.get("exp_alerts"))
    quiet["alert_rule_test"][0]["exp_alerts"] = [{"exp_labels": {"severity": "warning"}}]
    tests["tests"] = [quiet]
    (tmp_path / TESTS.name).write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [promtool, "test", "rules", TESTS.name], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode != 0
