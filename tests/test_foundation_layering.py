"""The import rules of docs/architecture.md, checked on the source (every import, at any depth)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"kvgate", "gateway", "workers", "tiering", "protocol", "migrations", "web"}

#: package -> our packages it must not import
FORBIDDEN = {
    "gateway": {"kvgate", "workers", "tiering"},
    "workers": {"kvgate", "gateway"},
    "tiering": {"kvgate", "gateway", "workers"},
    "protocol": OURS - {"protocol"},
    "migrations": OURS - {"migrations"},
}

#: the tiering modules that adapt the torch-free core to torch users (the only ones allowed torch)
TIERING_TORCH_ADAPTERS = {
    "tiering/pinned.py",
    "tiering/sglang_backend.py",
    "tiering/sglang_host_pool.py",
}


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(ROOT).parts[0]
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add(package if node.level else (node.module or "").split(".")[0])
    return roots


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_the_house_allows(package: str) -> None:
    violations = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sources(package)
        for name in sorted(imported_roots(path) & FORBIDDEN[package])
    ]
    assert violations == []


def test_gateway_never_imports_torch() -> None:
    offenders = [
        str(p.relative_to(ROOT)) for p in sources("gateway") if "torch" in imported_roots(p)
    ]
    assert offenders == []


def test_tiering_core_is_torch_free() -> None:
    offenders = {
        str(p.relative_to(ROOT)) for p in sources("tiering") if "torch" in imported_roots(p)
    }
    assert offenders <= TIERING_TORCH_ADAPTERS, (
        "torch belongs in tiering adapter modules only; list a new adapter in "
        "TIERING_TORCH_ADAPTERS if that is what it is"
    )


def test_the_checker_sees_relative_and_function_level_imports() -> None:
    # kvgate/services/postgres.py imports pgserver inside a function
    assert {"asyncpg", "pgserver", "psutil"} <= imported_roots(ROOT / "kvgate/services/postgres.py")
    assert {"kvgate", "migrations"} <= imported_roots(ROOT / "kvgate/stack_parts.py")
