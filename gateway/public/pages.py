"""The public pages: landing (the claim and its proof), benchmarks, pricing, API docs and
the playground.

No login anywhere here. The playground page is a shell: its script (``web/static/
playground.js``) talks to the same ``/v1`` API as any client, as the anonymous free tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from gateway.pages.charts import Bar, hbars
from gateway.pages.kit import PageKit
from gateway.public import estimate, figures, proof
from gateway.public.config import SiteConfig

#: Shown in the examples when no worker is registered yet.
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class PlanRow:
    """A plan as the pricing page shows it."""

    name: str
    monthly_price_cents: int
    requests_per_min: int
    tokens_per_min: int
    tokens_per_day: int
    max_concurrent: int
    max_context: int


class PublicPages:
    """Handlers of the pages anyone may read."""

    def __init__(self, site: PageKit, config: SiteConfig) -> None:
        self.site = site
        self.config = config

    async def landing(self, request: Request) -> Response:
        """The claim and its proof: a returning conversation's time to first token from each
        tier against recomputing it, from the latest multi-turn benchmark."""
        run = proof.headline(self.config.benchmarks_dir)
        charts: dict[str, Markup | None] = {"ttft_chart": None, "efficiency_chart": None}
        if run is not None:
            charts["ttft_chart"] = hbars(
                f"Time to first token of a returning conversation, {run.history:,}-token history",
                [
                    Bar(proof.LABELS[place], f"s-{place}", seconds, f"{seconds:.3g} s")
                    for place, seconds in run.ttft.items()
                ],
            )
            if run.efficiency:
                charts["efficiency_chart"] = hbars(
                    "Requests per second, as a share of a GPU with infinite memory",
                    [
                        Bar(proof.LABELS.get(tier, tier), f"s-{tier}", share, f"{share:.0%}")
                        for tier, share in run.efficiency.items()
                    ],
                )
        gpu = proof.load(self.config.benchmarks_dir, proof.GPU_STEM)
        return self.site.render(
            request,
            "site/landing.html",
            run=run,
            gpu=gpu,
            labels=proof.LABELS,
            names=proof.NAMES,
            **charts,
        )

    async def benchmarks(self, request: Request) -> Response:
        """Every benchmark report in full."""
        reports = figures.load(self.config.benchmarks_dir)
        return self.site.render(request, "site/benchmarks.html", reports=reports)

    async def pricing(self, request: Request) -> Response:
        """Every plan with its price, limits and per-token prices, and the estimator for the
        conversation in the query (``?turns=&history=&message=&answer=``; 400 with the
        problems named, and the defaults estimated, when a field is not a number in range)."""
        conversation, errors = estimate.parse(request.query_params)
        prices = self.site.config.billing.token_prices
        rows = await self.site.db.fetch(
            "SELECT name, monthly_price_cents, requests_per_min, tokens_per_min, "
            "tokens_per_day, max_concurrent, max_context FROM plans "
            "ORDER BY monthly_price_cents, name"
        )
        plans = [PlanRow(*r) for r in rows]
        return self.site.render(
            request,
            "site/pricing.html",
            400 if errors else 200,
            plans=plans,
            prices=prices,
            sales_email=self.config.sales_email,
            fields=estimate.FIELDS,
            conversation=conversation,
            errors=errors,
            estimate=estimate.estimate(conversation, prices),
        )

    async def docs(self, request: Request) -> Response:
        """API docs with curl and ``openai`` SDK examples against this gateway."""
        model = await self.site.db.fetchval("SELECT min(model) FROM workers") or DEFAULT_MODEL
        return self.site.render(
            request, "site/docs.html", base_url=self.site.link("/v1"), model=model
        )

    async def playground(self, request: Request) -> Response:
        """The chat playground (the free tier, in the browser)."""
        return self.site.render(request, "site/playground.html")
