"""Settings of the accounts and console side: filled by ``kvgate`` or by tests directly."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.billing.config import BillingConfig


@dataclass(frozen=True)
class SmtpConfig:
    """Where email goes; ``host`` empty means "log the message instead" (local use)."""

    host: str = ""
    port: int = 587
    username: str = ""
    password: str = ""
    sender: str = "kvgate <no-reply@localhost>"
    starttls: bool = True


@dataclass(frozen=True)
class AccountsConfig:
    """Everything the console, sign-in and billing routes need to know."""

    #: Keys the CSRF tokens; must be the same on every replica. Empty: a random one per
    #: process, fine for one local gateway, wrong behind a load balancer.
    session_secret: str = ""
    #: Where browsers reach the gateway; email links point here, and an ``https://`` URL
    #: marks cookies Secure.
    public_base_url: str = "http://127.0.0.1:8000"
    #: How long a sign-in lasts.
    session_ttl_s: int = 14 * 24 * 3600
    #: Lifetime of email verification / invitation links, and of password-reset links.
    email_link_ttl_s: int = 3 * 24 * 3600
    reset_link_ttl_s: int = 3600
    #: Failed logins in a row (per email and client address) allowed before each further
    #: attempt must wait (doubling).
    login_free_failures: int = 10
    #: Sign-ins, sign-ups and password resets one client address may send per window,
    #: each form counted on its own (each costs a password hash, ~230 ms of a core).
    auth_per_address: int = 100
    auth_window_s: float = 600.0
    #: Links of one kind mailed to one address per hour; beyond it nothing is sent, so the
    #: forms cannot be used to flood someone's inbox.
    mails_per_hour: int = 5
    smtp: SmtpConfig = field(default_factory=SmtpConfig)
    billing: BillingConfig = field(default_factory=BillingConfig)

    @property
    def secure_cookies(self) -> bool:
        """Cookies carry ``Secure`` when the public URL is HTTPS."""
        return self.public_base_url.startswith("https://")
