"""/admin leads: filters and search, pipeline changes with their audit rows, notes, the
uncontacted flag, trial-use signals and score, and the CSV export."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway import accounts
from gateway.admin.signals import TrialUse, score
from gateway.admin.staff import create_user
from gateway.pages import users
from gateway.public import leads
from tests.support.accounts import form_token
from tests.support.site import fresh_ip, site_app, staff_account


async def _lead(pool: asyncpg.Pool, company: str, email: str | None = None, ip: str = "") -> int:
    form = leads.LeadForm(
        "Pat Doe",
        email or f"pat-{uuid.uuid4().hex[:8]}@example.com",
        company,
        "51-200",
        "1B-10B",
        "agents",
        "hello",
    )
    return await leads.store(pool, form, ip or fresh_ip(), 100, 3600)


async def test_filters_and_search_narrow_the_pipeline(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    tag = uuid.uuid4().hex[:8]
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    ids = [await _lead(pg_pool, f"Acme {tag} {n}") for n in range(3)]
    await pg_pool.execute("UPDATE leads SET status = 'qualified' WHERE id = $1", ids[1])
    client = staff.client
    everything = await client.get("/admin/leads", params={"q": tag})
    assert everything.status_code == 200
    assert all(f"/admin/leads/{i}" in everything.text for i in ids)
    qualified = await client.get("/admin/leads", params={"q": tag, "status": "qualified"})
    assert f"/admin/leads/{ids[1]}" in qualified.text
    assert f"/admin/leads/{ids[0]}" not in qualified.text
    one = await client.get("/admin/leads", params={"q": f"Acme {tag} 2"})
    assert [i for i in ids if f'/admin/leads/{i}"' in one.text] == [ids[2]]
    # LIKE wildcards typed into the search are taken literally.
    assert "/admin/leads/" not in (await client.get("/admin/leads", params={"q": f"{tag}%_"})).text


async def test_status_changes_need_a_lost_reason_and_are_audited(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    staff_id = await pg_pool.fetchval("SELECT id FROM users WHERE email = $1", staff.email)
    lead_id = await _lead(pg_pool, "Lost Co")
    page = f"/admin/leads/{lead_id}"
    token = await form_token(staff.client, page)

    refused = await staff.client.post(page, data={"csrf_token": token, "status": "lost"})
    assert refused.status_code == 400 and "Say why the lead was lost" in refused.text
    assert await pg_pool.fetchval("SELECT status FROM leads WHERE id = $1", lead_id) == "new"

    data = {
        "csrf_token": token,
        "status": "lost",
        "lost_reason": "went with a competitor",
        "owner_id": str(staff_id),
        "next_follow_up": "2027-01-15",
    }
    assert (await staff.client.post(page, data=data)).status_code == 303
    row = await pg_pool.fetchrow("SELECT * FROM leads WHERE id = $1", lead_id)
    assert (row["status"], row["lost_reason"], row["owner_id"]) == (
        "lost",
        "went with a competitor",
        staff_id,
    )
    assert row["contacted_at"] is not None and str(row["next_follow_up"]) == "2027-01-15"
    audit = await pg_pool.fetchrow(
        "SELECT * FROM admin_audit WHERE target = $1 AND action = 'lead.update'", f"lead:{lead_id}"
    )
    assert audit["actor_email"] == staff.email
    assert json.loads(audit["before"])["status"] == "new"
    assert json.loads(audit["after"]) == {
        "status": "lost",
        "lost_reason": "went with a competitor",
        "owner_id": staff_id,
        "next_follow_up": "2027-01-15",
    }
    # The lead page shows its history.
    assert "went with a competitor" in (await staff.client.get(page)).text


async def test_only_staff_can_own_a_lead(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    customer, _ = await create_user(
        pg_pool, f"c-{uuid.uuid4().hex[:8]}@example.com", "long-password-1", staff=False
    )
    lead_id = await _lead(pg_pool, "Owned Co")
    token = await form_token(staff.client, f"/admin/leads/{lead_id}")
    data = {"csrf_token": token, "status": "contacted", "owner_id": str(customer)}
    response = await staff.client.post(f"/admin/leads/{lead_id}", data=data)
    assert response.status_code == 400 and "must be a staff member" in response.text
    assert await pg_pool.fetchval("SELECT owner_id FROM leads WHERE id = $1", lead_id) is None


async def test_notes_form_a_timeline_in_order_with_their_authors(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    lead_id = await _lead(pg_pool, "Notes Co")
    token = await form_token(staff.client, f"/admin/leads/{lead_id}")
    for body in ("first call: voicemail", "second call: booked a demo"):
        response = await staff.client.post(
            f"/admin/leads/{lead_id}/notes", data={"csrf_token": token, "body": body}
        )
        assert response.status_code == 303
    empty = await staff.client.post(
        f"/admin/leads/{lead_id}/notes", data={"csrf_token": token, "body": "  "}
    )
    assert empty.status_code == 400
    html = (await staff.client.get(f"/admin/leads/{lead_id}")).text
    timeline = html[html.index('id="timeline"') :]
    assert timeline.index("voicemail") < timeline.index("booked a demo")
    assert staff.email in timeline
    count = await pg_pool.fetchval("SELECT count(*) FROM lead_notes WHERE lead_id = $1", lead_id)
    assert count == 2
    missing = await staff.client.post(
        "/admin/leads/999999999/notes", data={"csrf_token": token, "body": "hello?"}
    )
    assert missing.status_code == 404


async def test_leads_still_new_after_the_threshold_and_follow_ups_due_are_flagged(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    tag = uuid.uuid4().hex[:8]
    old_id, contacted_id = await _lead(pg_pool, f"Old {tag}"), await _lead(pg_pool, f"Old {tag}")
    fresh_id = await _lead(pg_pool, f"Old {tag}")
    await pg_pool.execute(
        "UPDATE leads SET created_at = now() - interval '3 days' WHERE id = ANY($1::bigint[])",
        [old_id, contacted_id],
    )
    await pg_pool.execute(
        "UPDATE leads SET status = 'contacted', next_follow_up = current_date - 1 WHERE id = $1",
        contacted_id,
    )
    app = site_app(pg_pool, uncontacted_after_s=2 * 24 * 3600)
    staff = await staff_account(pg_pool, app, caplog)
    flagged = await staff.client.get("/admin/leads", params={"q": tag, "uncontacted": "1"})
    assert f'/admin/leads/{old_id}"' in flagged.text
    assert f'/admin/leads/{contacted_id}"' not in flagged.text
    assert f'/admin/leads/{fresh_id}"' not in flagged.text
    assert flagged.text.count('class="flagged"') == 1
    # The contacted lead's follow-up date has passed: it is marked due.
    listing = (await staff.client.get("/admin/leads", params={"q": tag})).text
    assert listing.count(">due</span>") == 1
    row = listing[listing.index(f'/admin/leads/{contacted_id}"') :]
    assert row.index(">due</span>") < row.index("</tr>")


async def test_trial_use_from_the_same_ip_and_email_domain_feeds_the_score(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    domain = f"trial-{uuid.uuid4().hex[:8]}.test"
    ip = fresh_ip()
    keen = await _lead(pg_pool, "Keen Co", f"boss@{domain}", ip)
    cold = await _lead(pg_pool, "Cold Co")
    # A free-plan team with a member at the lead's domain.
    team = await accounts.create_team(pg_pool, f"trial-{uuid.uuid4().hex[:8]}", "free")
    member, _ = await create_user(pg_pool, f"dev@{domain}", "long-password-1", staff=False)
    await users.add_member(pg_pool, member, team.id, "owner")
    now = datetime.now(UTC)
    rows = [
        (None, ip, 200, 100, 50, now - timedelta(hours=2)),
        (None, ip, 429, 0, 0, now - timedelta(hours=1)),
        (team.id, None, 200, 1000, 200, now - timedelta(minutes=5)),
    ]
    for team_id, client_ip, status, prompt, completion, ts in rows:
        await pg_pool.execute(
            "INSERT INTO usage (request_id, ts, team_id, client_ip, subject, model, "
            "prompt_tokens, completion_tokens, latency_ms, status) "
            "VALUES ($1, $2, $3, $4::inet, 's', 'm', $5, $6, 1, $7)",
            uuid.uuid4().hex,
            ts,
            team_id,
            client_ip,
            prompt,
            completion,
            status,
        )
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    html = (await staff.client.get(f"/admin/leads/{keen}")).text
    trial = html[html.index('id="trial"') :]
    assert ">3<" in trial  # requests
    assert "1,350" in trial  # tokens
    assert now.strftime("%Y-%m-%d") in trial  # last seen
    keen_score = int(html.split('id="score">')[1].split("<")[0])
    cold_html = (await staff.client.get(f"/admin/leads/{cold}")).text
    cold_score = int(cold_html.split('id="score">')[1].split("<")[0])
    assert keen_score > cold_score


def test_score_rewards_use_limits_recency_and_stated_size() -> None:
    now = datetime.now(UTC)
    nothing = TrialUse(0, 0, None, 0)
    active = TrialUse(200, 500_000, now - timedelta(days=1), 0)
    limited = TrialUse(200, 500_000, now - timedelta(days=1), 3)
    stale = TrialUse(200, 500_000, now - timedelta(days=60), 0)
    assert score(nothing, "1-10", "< 10M", now) == 0
    assert score(nothing, "1000+", "> 10B", now) == 20
    assert score(limited, "1-10", "< 10M", now) > score(active, "1-10", "< 10M", now)
    assert score(active, "1-10", "< 10M", now) > score(stale, "1-10", "< 10M", now)
    assert score(TrialUse(10**9, 10**12, now, 1), "1000+", "> 10B", now) == 100


async def test_csv_export_has_the_filtered_leads_and_no_formulas(
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    tag = uuid.uuid4().hex[:8]
    plain = await _lead(pg_pool, f"Plain {tag}")
    sneaky = await _lead(pg_pool, f'=HYPERLINK("http://evil.test","{tag}")')
    app = site_app(pg_pool)
    staff = await staff_account(pg_pool, app, caplog)
    response = await staff.client.get("/admin/leads.csv", params={"q": tag})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    rows = {int(r["id"]): r for r in csv.DictReader(io.StringIO(response.text))}
    assert set(rows) == {plain, sneaky}
    assert rows[plain]["company"] == f"Plain {tag}" and rows[plain]["status"] == "new"
    assert rows[sneaky]["company"].startswith("'=")
    assert {"email", "score", "trial_requests", "trial_limit_hits"} <= set(rows[plain])
    exported = await pg_pool.fetchval(
        "SELECT count(*) FROM admin_audit WHERE action = 'leads.export' AND actor_email = $1",
        staff.email,
    )
    assert exported == 1
