"""The local SeaweedFS runs with a Go memory limit unless the environment chose one."""

from __future__ import annotations

import pytest

from kvgate.stack.seaweed import WEED_MEMORY_LIMIT, weed_env


def test_weed_gets_a_memory_limit_unless_the_environment_sets_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    assert weed_env() == {"GOMEMLIMIT": WEED_MEMORY_LIMIT}
    monkeypatch.setenv("GOMEMLIMIT", "2GiB")
    assert weed_env() == {"GOMEMLIMIT": "2GiB"}
