"""The house rules of docs/architecture.md, checked on the source (every import, at any depth).

Each rule is a function over a source tree, so that the tests below can show it catching a
violation in a made-up tree as well as passing on the real one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"kvgate", "gateway", "workers", "tiering", "protocol", "migrations", "web"}

#: package -> our packages it must not import (imports flow kvgate -> gateway | workers ->
#: tiering -> protocol)
FORBIDDEN = {
    "gateway": {"kvgate", "workers", "tiering"},
    "workers": {"kvgate", "gateway"},
    "tiering": {"kvgate", "gateway", "workers"},
    "protocol": OURS - {"protocol"},
    "migrations": OURS - {"migrations"},
    "web": OURS - {"web"},
}

#: the one part of tiering that may use torch: SGLang's storage backend runs inside SGLang
TIERING_ADAPTER = "tiering/sglang/"

#: name prefixes that would stand in for a package (a subpackage is the place for them)
PACKAGE_PREFIXES = ("bench_", "cmd_", "stack_", "sglang_", "console_", "admin_")

#: words of project history, not of what a thing is
MILESTONE_WORDS = re.compile(
    r"foundation|milestone|acceptance|wave|session|issue|sprint|(?:^|_)m\d+(?:_|$)"
)

#: the folders of tests/: one per package, end-to-end scenarios, and shared helpers
TEST_FOLDERS = OURS | {"e2e", "support"}

CYCLE_NOTE = "# import cycle:"


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path) -> dict[str, int]:
    """Every module ``path`` imports (relative imports resolved) -> the line of the import.
    ``from a import b`` counts as importing ``a`` and ``a.b``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.setdefault(base, node.lineno)
            for alias in node.names:
                found.setdefault(f"{base}.{alias.name}", node.lineno)
    return found


def imported_roots(root: Path, path: Path) -> set[str]:
    return {name.split(".")[0] for name in imports(root, path)}


def sources(root: Path, package: str) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def forbidden_imports(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)} imports {name}"
        for package, banned in sorted(FORBIDDEN.items())
        for path in sources(root, package)
        for name in sorted(imported_roots(root, path) & banned)
    ]


def torch_outside_its_places(root: Path) -> list[str]:
    """torch in the gateway, in protocol, or in tiering's core (all of tiering but its adapter)."""
    offenders = []
    for package in ("gateway", "protocol", "tiering"):
        for path in sources(root, package):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(TIERING_ADAPTER):
                continue
            if "torch" in imported_roots(root, path):
                offenders.append(rel)
    return offenders


def core_imports_adapter(root: Path) -> list[str]:
    """tiering's core importing its SGLang adapter (the adapter sits on the core, not under it)."""
    return [
        str(path.relative_to(root))
        for path in sources(root, "tiering")
        if not path.relative_to(root).as_posix().startswith(TIERING_ADAPTER)
        and any(name.startswith("tiering.sglang") for name in imports(root, path))
    ]


def prefixed_modules(root: Path) -> list[str]:
    return [
        str(path.relative_to(root))
        for package in ("kvgate", "gateway", "workers", "tiering")
        for path in sources(root, package)
        if path.name.startswith(PACKAGE_PREFIXES)
    ]


def stand_ins_in_products(root: Path) -> list[str]:
    """Product code importing a stand-in: those live in kvgate/bench/ or tests/ only."""
    offenders = []
    for package in sorted(OURS):
        for path in sources(root, package):
            if path.relative_to(root).as_posix().startswith("kvgate/bench/"):
                continue
            if any(name.startswith(("kvgate.bench", "tests")) for name in imports(root, path)):
                offenders.append(str(path.relative_to(root)))
    return offenders


def unexplained_cycles(root: Path) -> list[str]:
    """Pairs of modules that import each other with no ``# import cycle:`` note at either
    import (on its line or the line above) saying why it must be so."""
    paths = {module_name(root, p): p for package in OURS for p in sources(root, package)}
    graph = {
        name: {m: line for m, line in imports(root, p).items() if m in paths and m != name}
        for name, p in paths.items()
    }

    def noted(module: str, line: int) -> bool:
        lines = paths[module].read_text().splitlines()
        return any(CYCLE_NOTE in lines[i] for i in (line - 2, line - 1) if 0 <= i < len(lines))

    return [
        f"{a} <-> {b}"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if a < b and a in graph[b] and not (noted(a, graph[a][b]) or noted(b, graph[b][a]))
    ]


def misplaced_tests(root: Path) -> list[str]:
    tests = root / "tests"
    return [
        str(path.relative_to(root))
        for path in sorted(tests.rglob("*.py"))
        if (path.parent != tests and path.relative_to(tests).parts[0] not in TEST_FOLDERS)
        or MILESTONE_WORDS.search(path.stem)
    ]


RULES = [
    forbidden_imports,
    torch_outside_its_places,
    core_imports_adapter,
    prefixed_modules,
    stand_ins_in_products,
    unexplained_cycles,
    misplaced_tests,
]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_the_house_keeps_its_rules(rule) -> None:
    assert rule(ROOT) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_torch_in_tiering_core_breaks_the_rule(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tiering/tiers/fast.py": "def f():\n    import torch\n",
            "tiering/sglang/backend.py": "import torch\n",
            "tiering/codec.py": "import numpy\n",
        },
    )
    assert torch_outside_its_places(root) == ["tiering/tiers/fast.py"]


def test_the_other_rules_catch_what_they_name(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "gateway/app.py": "from workers import server\n",
            "gateway/bench_thing.py": "",
            "tiering/store.py": "from tiering.sglang import options\n",
            "workers/a.py": "from workers import b\n",
            "workers/b.py": "from workers.a import x\n",
            "workers/c.py": "# import cycle: d needs c's types\nfrom workers import d\n",
            "workers/d.py": "from workers.c import y\n",
            "kvgate/wiring/e.py": "from kvgate.bench.stub_upstream import run\n",
            "tests/test_foundation_x.py": "",
            "tests/misc/test_y.py": "",
        },
    )
    assert forbidden_imports(root) == ["gateway/app.py imports workers"]
    assert prefixed_modules(root) == ["gateway/bench_thing.py"]
    assert core_imports_adapter(root) == ["tiering/store.py"]
    assert unexplained_cycles(root) == ["workers.a <-> workers.b"]
    assert stand_ins_in_products(root) == ["kvgate/wiring/e.py"]
    assert misplaced_tests(root) == ["tests/misc/test_y.py", "tests/test_foundation_x.py"]


def test_the_checker_sees_relative_and_function_level_imports() -> None:
    # kvgate/stack/postgres.py imports pgserver inside a function
    assert {"asyncpg", "pgserver", "psutil"} <= imported_roots(
        ROOT, ROOT / "kvgate/stack/postgres.py"
    )
    assert {"kvgate", "migrations"} <= imported_roots(ROOT, ROOT / "kvgate/stack/parts.py")
