"""The route crawl's world: the application's own routes, and a team, key, lead and a user
per role to fill their paths and sign in with (tests/gateway/test_route_crawl.py checks what
each role gets; tests/e2e/test_a11y.py audits every page a role can see)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
from starlette.routing import Mount, Route

from gateway import accounts
from gateway.admin.staff import create_user
from gateway.app import build_app
from gateway.config import GatewayConfig
from gateway.pages import users
from gateway.public import leads

PASSWORD = "crawl-password-1"


@dataclass
class World:
    """The ids the crawl fills into paths, and a session per role."""

    team_id: int
    key_id: int
    lead_id: int
    user_ids: dict[str, int]


async def make_world(pool: asyncpg.Pool) -> World:
    """A team on the ``team`` plan with a key, its owner, a member and a member to remove,
    a staff user, and a lead."""
    tag = uuid.uuid4().hex[:8]
    team = await accounts.create_team(pool, f"crawl-{tag}", "team")
    key, _ = await accounts.create_key(pool, team.name, "crawl")
    ids = {}
    for role in ("member", "owner", "staff", "leaver"):
        ids[role], _ = await create_user(
            pool, f"crawl-{role}-{tag}@example.com", PASSWORD, staff=role == "staff"
        )
    await users.add_member(pool, ids["owner"], team.id, "owner")
    await users.add_member(pool, ids["member"], team.id, "member")
    # the member whom the owner's crawl of /members/{user_id}/remove takes out of the team
    await users.add_member(pool, ids["leaver"], team.id, "member")
    form = leads.LeadForm("Crawl", f"crawl-{tag}@example.com", "Crawl Co", "1-10", "< 10M", "", "")
    lead_id = await leads.store(pool, form, "10.255.0.1", 1000, 60)
    return World(team.id, key.id, lead_id, ids)


def app_routes() -> list[tuple[str, str]]:
    """Every (method, path) of the gateway's route table; a mount is one GET."""
    app = build_app(GatewayConfig(dsn="unused: only the route table is read"))
    out = []
    for route in app.routes:
        if isinstance(route, Route):
            out += [(m, route.path) for m in sorted(route.methods or ()) if m != "HEAD"]
        elif isinstance(route, Mount):
            out.append(("GET", route.path))
        else:
            raise AssertionError(f"unexpected route type {route!r}: teach the crawl about it")
    return out


def fill(path: str, world: World) -> str:
    """``path`` with its ids taken from ``world``."""
    return (
        path.replace("{team_id:int}", str(world.team_id))
        .replace("{key_id:int}", str(world.key_id))
        .replace("{lead_id:int}", str(world.lead_id))
        .replace("{user_id:int}", str(world.user_ids["leaver"]))
    )
