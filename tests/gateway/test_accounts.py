"""Teams and API keys: minting, hashing, lookup, revocation, and the admin CLI."""

from __future__ import annotations

import hashlib
import uuid

import asyncpg
import pytest
from click.testing import CliRunner

from gateway import accounts, keys
from gateway.auth import Authenticator
from kvgate.cli import cli


def test_minted_keys_are_long_random_and_stored_as_hash_and_prefix() -> None:
    a, b = keys.mint(), keys.mint()
    assert a.secret != b.secret
    assert a.secret.startswith("kvg_") and len(a.secret) >= 4 + 43
    assert keys.well_formed(a.secret)
    assert a.prefix == a.secret[:12] and a.secret not in a.key_hash.hex()
    assert a.key_hash == keys.hash_key(a.secret)
    for bad in ("", "kvg_", "sk-" + "a" * 48, "kvg_" + "a" * 42, "kvg_" + "!" * 43):
        assert not keys.well_formed(bad)


async def test_key_lookup_follows_revocation(pg_pool: asyncpg.Pool) -> None:
    team = await accounts.create_team(pg_pool, f"acme-{uuid.uuid4().hex[:8]}")
    info, secret = await accounts.create_key(pg_pool, team.name, "ci")
    owner = await accounts.lookup_key(pg_pool, secret)
    assert owner is not None
    assert (owner.key_id, owner.team_id, owner.plan.name) == (info.id, team.id, "team")
    assert owner.cache_salt == team.cache_salt and len(team.cache_salt) >= 32
    stored = await pg_pool.fetchval("SELECT key_hash FROM api_keys WHERE id = $1", info.id)
    assert bytes(stored) == keys.hash_key(secret)

    revoked = await accounts.revoke_key(pg_pool, info.id)
    assert revoked.revoked_at is not None
    assert await accounts.lookup_key(pg_pool, secret) is None
    assert await accounts.lookup_key(pg_pool, keys.mint().secret) is None


async def test_free_tier_clients_in_one_ipv6_64_share_limits_and_cache(
    pg_pool: asyncpg.Pool,
) -> None:
    auth = Authenticator(pg_pool, ttl_s=2)
    one = await auth.authenticate(None, "2001:db8:7:7::1")
    same = await auth.authenticate(None, "2001:db8:7:7:abcd::2")
    other = await auth.authenticate(None, "2001:db8:7:8::1")
    assert (one.subject, one.cache_salt) == (same.subject, same.cache_salt)
    assert one.subject != other.subject and one.cache_salt != other.cache_salt
    assert same.client_ip == "2001:db8:7:7:abcd::2"  # usage rows keep the real address


async def test_admin_errors_say_what_to_do(pg_pool: asyncpg.Pool) -> None:
    name = f"dup-{uuid.uuid4().hex[:8]}"
    await accounts.create_team(pg_pool, name)
    with pytest.raises(accounts.AccountError, match="already exists"):
        await accounts.create_team(pg_pool, name)
    with pytest.raises(accounts.AccountError, match="no plan named"):
        await accounts.create_team(pg_pool, name + "x", plan="gold")
    with pytest.raises(accounts.AccountError, match="kvgate admin teams create"):
        await accounts.create_key(pg_pool, "no-such-team")


def test_admin_cli_creates_lists_and_revokes(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", pg_dsn)
    runner = CliRunner()
    team = f"cli-{uuid.uuid4().hex[:8]}"
    out = runner.invoke(cli, ["admin", "teams", "create", team])
    assert out.exit_code == 0, out.output
    assert team in runner.invoke(cli, ["admin", "teams", "list"]).output

    created = runner.invoke(cli, ["admin", "keys", "create", "--team", team, "--name", "laptop"])
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip().splitlines()[-1]
    assert keys.well_formed(secret)

    listing = runner.invoke(cli, ["admin", "keys", "list", "--team", team]).output
    assert keys.visible_prefix(secret) in listing and secret not in listing
    key_id = listing.split("\t")[0]
    revoked = runner.invoke(cli, ["admin", "keys", "revoke", key_id])
    assert revoked.exit_code == 0, revoked.output
    assert "revoked" in runner.invoke(cli, ["admin", "keys", "list", "--team", team]).output

    missing = runner.invoke(cli, ["admin", "keys", "create", "--team", team + "-nope"])
    assert missing.exit_code != 0 and "kvgate admin teams create" in missing.output


async def test_the_free_tiers_cache_salt_cannot_be_computed_from_an_address(
    pg_pool: asyncpg.Pool,
) -> None:
    """Whoever knows an address but not the replicas' secret cannot name its cache namespace
    (the salt was an unkeyed hash of the address: anyone reaching a worker could probe)."""
    address = "203.0.113.77"
    salt = (await Authenticator(pg_pool, 2, b"secret-a").authenticate(None, address)).cache_salt
    unkeyed = hashlib.sha256(f"free:{address}".encode()).hexdigest()[:32]
    other = (await Authenticator(pg_pool, 2, b"secret-b").authenticate(None, address)).cache_salt
    again = (await Authenticator(pg_pool, 2, b"secret-a").authenticate(None, address)).cache_salt
    assert salt != unkeyed and salt != other and salt == again
