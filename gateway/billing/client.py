"""The Stripe client every billing operation goes through.

``http_client`` is stripe-python's own transport seam: production leaves it None (the
library picks its default), tests pass a recording stub so no request leaves the machine.
"""

from __future__ import annotations

import stripe

from gateway.billing.config import BillingConfig


class BillingDisabled(RuntimeError):
    """Stripe is not configured; the message names the setting to set."""


def stripe_client(
    config: BillingConfig, http_client: stripe.HTTPClient | None = None
) -> stripe.StripeClient:
    """A client for ``config``'s account, retrying 5xx and connection errors itself."""
    if not config.secret_key:
        raise BillingDisabled(
            "Stripe is not configured: set KVGATE_STRIPE_SECRET_KEY (and the price settings)."
        )
    return stripe.StripeClient(
        config.secret_key,
        max_network_retries=config.max_network_retries,
        http_client=http_client,
    )
