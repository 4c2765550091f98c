"""The billing side's settings: filled by ``kvgate`` from its Settings, or by tests directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

#: Prices are quoted per this many tokens.
PER = 1_000_000


@dataclass(frozen=True)
class TokenPrices:
    """US dollars per million tokens on each meter (see ``gateway.billing.meters.METERS``).

    Stripe bills with the metered prices (``BillingConfig.metered_prices``); these are their
    unit amounts, as the pricing page shows them and the console values cached tokens. The
    operator sets both to the same figures. Cached input is the cheap one: its KV came back
    from a tier instead of being computed again.
    """

    input: Decimal = Decimal("0.50")
    cached_input: Decimal = Decimal("0.05")
    output: Decimal = Decimal("1.50")

    def cost(self, uncached_input: int, cached_input: int, output: int) -> Decimal:
        """What these token counts cost, in dollars, unrounded."""
        total = uncached_input * self.input + cached_input * self.cached_input
        return (total + output * self.output) / PER

    def cached_saving(self, cached_input: int) -> Decimal:
        """What ``cached_input`` tokens saved against paying for them as uncached input."""
        return cached_input * (self.input - self.cached_input) / PER


@dataclass(frozen=True)
class BillingConfig:
    """How to talk to Stripe and how plans and meters map onto it.

    Without a secret key the console still shows plans but cannot start a checkout; without
    a webhook secret every webhook is refused (a forged event must never change a plan).
    """

    #: Stripe API key (``sk_live_...`` / ``sk_test_...``); empty disables checkout and meters.
    secret_key: str = ""
    #: Signing secret of the webhook endpoint (``whsec_...``).
    webhook_secret: str = ""
    #: plan name -> Stripe price id of its subscription; plans absent here cannot be bought.
    prices: dict[str, str] = field(default_factory=dict)
    #: Metered prices (one per meter) added to every subscription, so reported usage bills.
    metered_prices: tuple[str, ...] = ()
    #: meter name (see ``gateway.billing.meters.METERS``) -> Stripe meter id, for reconcile.
    meter_ids: dict[str, str] = field(default_factory=dict)
    #: Unit amounts of ``metered_prices``: what paid plans pay per million tokens.
    token_prices: TokenPrices = field(default_factory=TokenPrices)
    #: Days a team keeps its paid limits after a failed payment before dropping to free.
    grace_days: float = 3.0
    #: Retries of a Stripe request that failed with a 5xx or a connection error.
    max_network_retries: int = 3

    def plan_for_price(self, price_id: str) -> str | None:
        """The plan sold by ``price_id``, or None for a price we do not know."""
        for plan, price in self.prices.items():
            if price == price_id:
                return plan
        return None
