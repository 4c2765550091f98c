"""Outgoing email: SMTP when configured, otherwise the message is logged.

Logging is the local mode: someone running ``kvgate up`` on a laptop has no mail server,
so the verification or reset link appears in the gateway's log, where they can follow it.
"""

from __future__ import annotations

import asyncio
import logging
import smtplib
from dataclasses import dataclass
from email.message import EmailMessage

from gateway.pages.config import SmtpConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Email:
    """One plain-text message."""

    to: str
    subject: str
    body: str


class Mailer:
    """Sends :class:`Email` through the configured SMTP server, or logs it."""

    def __init__(self, config: SmtpConfig) -> None:
        self._config = config

    async def send(self, email: Email) -> None:
        """Deliver ``email`` (in a thread: smtplib blocks)."""
        if not self._config.host:
            # WARNING, not INFO: the gateway runs with warnings on, and an operator who
            # forgot SMTP in production should notice that mail is not leaving.
            log.warning(
                "SMTP not configured (set KVGATE_SMTP_HOST); email to %s logged instead:\n"
                "Subject: %s\n\n%s",
                email.to,
                email.subject,
                email.body,
            )
            return
        await asyncio.to_thread(self._deliver, email)

    def _deliver(self, email: Email) -> None:
        cfg = self._config
        message = EmailMessage()
        message["From"] = cfg.sender
        message["To"] = email.to
        message["Subject"] = email.subject
        message.set_content(email.body)
        with smtplib.SMTP(cfg.host, cfg.port, timeout=30) as smtp:
            if cfg.starttls:
                smtp.starttls()
            if cfg.username:
                smtp.login(cfg.username, cfg.password)
            smtp.send_message(message)
