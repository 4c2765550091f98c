"""/admin/leads: the pipeline with filters and search, a lead's page, changes, CSV export."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from gateway.admin import audit, pipeline
from gateway.pages.kit import PageKit, text_field
from gateway.pages.sessions import SessionUser
from gateway.public.config import SiteConfig


def _cell(value: object) -> object:
    """A CSV cell that a spreadsheet will not run: text a visitor typed could start with
    ``=``, ``+``, ``-`` or ``@`` and become a formula (OWASP's CSV injection)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _filters(params: QueryParams) -> pipeline.Filters:
    owner = params.get("owner", "")
    return pipeline.Filters(
        status=params.get("status", "") if params.get("status") in pipeline.STATUSES else "",
        owner_id=int(owner) if owner.isdigit() else None,
        q=params.get("q", "").strip(),
        uncontacted_only=params.get("uncontacted") == "1",
    )


class LeadViews:
    """Handlers of the leads pages (each called with the signed-in staff user)."""

    def __init__(self, site: PageKit, config: SiteConfig) -> None:
        self.site = site
        self.config = config

    async def list(self, request: Request, user: SessionUser) -> Response:
        """The pipeline, filtered by the query string."""
        filters = _filters(request.query_params)
        leads = await pipeline.search(self.site.db, filters, self.config.uncontacted_after_s)
        return self.site.render(
            request,
            "admin/leads.html",
            user=user,
            leads=leads,
            filters=filters,
            statuses=pipeline.STATUSES,
            staff=await pipeline.staff(self.site.db),
            query=str(request.query_params),
            today=datetime.now(UTC).date(),
        )

    async def detail(self, request: Request, user: SessionUser, error: str = "") -> Response:
        """One lead: what they told us, trial use, score, state and the notes timeline."""
        lead_id = request.path_params["lead_id"]
        lead = await pipeline.get(self.site.db, lead_id, self.config.uncontacted_after_s)
        if lead is None:
            return PlainTextResponse("No such lead.", status_code=404)
        return self.site.render(
            request,
            "admin/lead.html",
            400 if error else 200,
            user=user,
            lead=lead,
            notes=await pipeline.notes(self.site.db, lead_id),
            statuses=pipeline.STATUSES,
            staff=await pipeline.staff(self.site.db),
            history=await audit.recent(self.site.db, 50, f"lead:{lead_id}"),
            error=error,
        )

    async def update(self, request: Request, user: SessionUser) -> Response:
        """Change status (with a reason when lost), owner and next follow-up date."""
        lead_id = request.path_params["lead_id"]
        form = await request.form()
        owner = text_field(form, "owner_id")
        follow_up = text_field(form, "next_follow_up")
        try:
            changes = {
                "status": text_field(form, "status"),
                "lost_reason": text_field(form, "lost_reason"),
                "owner_id": int(owner) if owner else None,
                "next_follow_up": date.fromisoformat(follow_up) if follow_up else None,
            }
        except ValueError:
            return await self.detail(request, user, "Dates are YYYY-MM-DD; pick the owner.")
        try:
            async with self.site.db.acquire() as conn, conn.transaction():
                before, after = await pipeline.update(conn, lead_id, changes)
                if before != after:
                    await audit.record(conn, user, "lead.update", f"lead:{lead_id}", before, after)
        except pipeline.LeadError as exc:
            return await self.detail(request, user, str(exc))
        return RedirectResponse(f"/admin/leads/{lead_id}", status_code=303)

    async def note(self, request: Request, user: SessionUser) -> Response:
        """Add a note to the lead's timeline."""
        lead_id = request.path_params["lead_id"]
        body = text_field(await request.form(), "body")
        try:
            async with self.site.db.acquire() as conn, conn.transaction():
                if not await pipeline.exists(conn, lead_id):
                    return PlainTextResponse("No such lead.", status_code=404)
                await pipeline.add_note(conn, lead_id, user.id, body)
                await audit.record(conn, user, "lead.note", f"lead:{lead_id}", None, {"body": body})
        except pipeline.LeadError as exc:
            return await self.detail(request, user, str(exc))
        return RedirectResponse(f"/admin/leads/{lead_id}#notes", status_code=303)

    async def export(self, request: Request, user: SessionUser) -> Response:
        """The filtered pipeline as CSV (the export itself is audited: it carries PII)."""
        filters = _filters(request.query_params)
        leads = await pipeline.search(self.site.db, filters, self.config.uncontacted_after_s)
        out = io.StringIO()
        rows = [{k: _cell(v) for k, v in pipeline.csv_row(lead).items()} for lead in leads]
        fieldnames = list(rows[0]) if rows else ["id"]
        writer = csv.DictWriter(out, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        await audit.record(
            self.site.db,
            user,
            "leads.export",
            "leads",
            None,
            {"query": str(request.query_params), "rows": len(rows)},
        )
        return Response(
            out.getvalue(),
            media_type="text/csv; charset=utf-8",
            headers={
                "content-disposition": 'attachment; filename="leads.csv"',
                "cache-control": "no-store",
            },
        )
