"""``kvgate config`` hides secrets; the README's settings table matches the code; settings
that contradict each other are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvgate.settings import Settings, mask_url_password
from kvgate.settings_doc import embedded_table, env_names, markdown_table
from tests.support.commands import kvgate_env

README = Path(__file__).resolve().parents[2] / "README.md"


def _config(tmp_path: Path, *args: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kvgate", "config", *args],
        env=kvgate_env(tmp_path / "home", **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def test_config_masks_the_database_password_and_the_s3_secrets(tmp_path: Path) -> None:
    secrets = {
        "DATABASE_URL": "postgresql://app:hunter2@db.internal:5432/kv",
        "KVGATE_S3_ACCESS_KEY": "AKIAEXAMPLEKEY",
        "KVGATE_S3_SECRET_KEY": "wJalrXUtnFEMI",
    }
    text = _config(tmp_path, **secrets)
    for secret in ("hunter2", "AKIAEXAMPLEKEY", "wJalrXUtnFEMI"):
        assert secret not in text
    assert "postgresql://app:****@db.internal:5432/kv" in text
    values = json.loads(_config(tmp_path, "--json", **secrets))
    assert values["database_url"] == "postgresql://app:****@db.internal:5432/kv"
    assert values["s3_secret_key"] == "********"


def test_mask_url_password_covers_query_passwords_and_leaves_the_rest() -> None:
    assert mask_url_password("postgresql://u@h/db?password=p%40ss&sslmode=require") == (
        "postgresql://u@h/db?password=****&sslmode=require"
    )
    embedded = "postgresql://postgres:@/postgres?host=/tmp/kv/pg"
    assert mask_url_password(embedded) == embedded
    assert mask_url_password("postgresql://u:p:a@ss@h/db") == "postgresql://u:****@h/db"


def test_readme_settings_table_lists_every_settings_field_and_no_other() -> None:
    table = embedded_table(README.read_text())
    listed = {row.split("`")[1] for row in table.splitlines()[2:] if row.startswith("| `")}
    fields = {env_names(name, field)[0] for name, field in Settings.model_fields.items()}
    assert listed == fields, (
        "README.md's settings table is out of step with kvgate/settings.py "
        f"(missing {sorted(fields - listed)}, stale {sorted(listed - fields)}): run `make readme`"
    )
    # and every row as the code has it now: a default or a meaning changed in the code only
    # leaves the README saying something else
    assert table == markdown_table(), "README.md's settings table is stale: run `make readme`"


def test_generated_table_has_a_row_per_field_with_its_description() -> None:
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(Settings.model_fields)
    for row, field in zip(rows, Settings.model_fields.values(), strict=True):
        escaped = (field.description or "").replace("|", "\\|")
        assert row.endswith(f" {escaped} |")


def test_a_nas_cap_at_or_below_the_high_watermark_is_refused_with_both_names() -> None:
    assert Settings(tier_nas_high_bytes=16, tier_nas_max_bytes=20).tier_nas_max_bytes == 20
    for high in (20, 24, 0):  # tierd would never demote before the writers stop
        with pytest.raises(ValidationError, match=r"KVGATE_TIER_NAS_MAX_BYTES.*HIGH_BYTES"):
            Settings(tier_nas_high_bytes=high, tier_nas_low_bytes=0, tier_nas_max_bytes=20)
