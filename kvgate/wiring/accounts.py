"""Map kvgate's Settings onto the accounts/billing config of the gateway (and the CLI)."""

from __future__ import annotations

from decimal import Decimal

from gateway.billing.config import BillingConfig, TokenPrices
from gateway.pages.config import AccountsConfig, SmtpConfig
from kvgate.settings import Settings


def billing_config(settings: Settings) -> BillingConfig:
    """The Stripe side of ``settings``."""
    return BillingConfig(
        secret_key=settings.stripe_secret_key.get_secret_value(),
        webhook_secret=settings.stripe_webhook_secret.get_secret_value(),
        prices=dict(settings.stripe_prices),
        metered_prices=tuple(settings.stripe_metered_prices),
        meter_ids=dict(settings.stripe_meter_ids),
        # via str: the figure as typed (0.05), not the float nearest to it
        token_prices=TokenPrices(
            *(
                Decimal(str(p))
                for p in (settings.price_input, settings.price_cached_input, settings.price_output)
            )
        ),
        grace_days=settings.billing_grace_days,
    )


def accounts_config(settings: Settings) -> AccountsConfig:
    """Console, sign-in, email and billing settings for the gateway."""
    return AccountsConfig(
        session_secret=settings.session_secret.get_secret_value(),
        public_base_url=settings.public_base_url,
        smtp=SmtpConfig(
            host=settings.smtp_host,
            port=settings.smtp_port,
            username=settings.smtp_username,
            password=settings.smtp_password.get_secret_value(),
            sender=settings.smtp_sender,
            starttls=settings.smtp_starttls,
        ),
        billing=billing_config(settings),
    )
