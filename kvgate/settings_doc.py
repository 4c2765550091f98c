"""The settings reference as a Markdown table, generated from the ``Settings`` fields.

README.md embeds this table between ``<!-- settings-table:start -->`` and
``<!-- settings-table:end -->``; a test keeps the two equal, so the README cannot drift
from the code. ``make readme`` (``python -m kvgate.settings_doc``) rewrites the block.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo

from kvgate.settings import Settings

START = "<!-- settings-table:start -->"
END = "<!-- settings-table:end -->"


def env_names(name: str, field: FieldInfo) -> list[str]:
    """The environment variables that set field ``name`` (the first one wins)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str) and c.isupper()]
    return [f"KVGATE_{name.upper()}"]


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "`********`"
    if isinstance(value, Path):
        value = str(value)
    return f"`{value}`"


def markdown_table() -> str:
    """One row per ``Settings`` field: environment variables, default and meaning."""
    rows = ["| Environment variable | Default | Meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        env = ", ".join(f"`{e}`" for e in env_names(name, field))
        meaning = (field.description or "").replace("|", "\\|")
        rows.append(f"| {env} | {_default(field)} | {meaning} |")
    return "\n".join(rows)


def embedded_table(readme: str) -> str:
    """The table currently between the markers of ``readme`` (empty when they are missing)."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        return ""
    return readme[start + len(START) : end].strip()


def rewrite(readme_path: Path) -> None:
    """Replace the table between the markers of ``readme_path`` with a fresh one."""
    text = readme_path.read_text()
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme_path}: add the lines {START} and {END} where the table goes")
    readme_path.write_text(f"{text[: start + len(START)]}\n{markdown_table()}\n{text[end:]}")


if __name__ == "__main__":
    rewrite(Path(sys.argv[1] if len(sys.argv) > 1 else "README.md"))
