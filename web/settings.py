"""Settings of the portal, read lazily from the environment (nothing at import time)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WebSettings(BaseSettings):
    """How the portal signs cookies, limits logins and caches figures."""

    model_config = SettingsConfigDict(env_prefix="YOCO_WEB_", extra="ignore", case_sensitive=False)

    #: Secret for signed cookies and CSRF tokens; when unset, a random key is kept in
    #: ``<data dir>/keys/web-secret`` (mode 0600) so sessions survive restarts.
    secret_key: str | None = None
    #: ``auto``: cookies are Secure when the request came over HTTPS; ``always`` / ``never``.
    secure_cookies: str = "auto"
    session_hours: float = 12.0
    #: The operator's e-mail alert destination (its name: ``yoco alerts add-email``)
    #: whose SMTP server, login and From address carry the alerts of the e-mail
    #: recipients a customer's admin adds at ``/account/alerts``; unset: that page
    #: offers webhooks only.
    customer_mail_via: str | None = None
    #: The operator's target for deciding a customer's dispute, in days, shown to the
    #: customer beside each open dispute (with how long it has waited).
    dispute_response_days: int = Field(default=10, ge=1)
    #: Failed logins allowed for one account at one client address, for one client
    #: over all accounts, and for one account over all clients, before that key backs
    #: off: blocked ``login_backoff_seconds``, doubled at each further failure, at most
    #: the window; a key quiet for a whole window starts again.
    login_failures_per_account: int = Field(default=5, ge=1)
    login_failures_per_address: int = Field(default=30, ge=1)
    login_failures_per_account_everywhere: int = Field(default=50, ge=1)
    login_backoff_seconds: float = Field(default=30.0, gt=0)
    login_window_minutes: float = Field(default=15.0, gt=0)
    #: Seconds a contract year's figures are reused (they are also recomputed as soon
    #: as the contract's log grows).
    figures_ttl_seconds: float = 60.0
    #: The bounds of the regions of the portal's one cache (``web.cache``, whose rule
    #: says what is kept and when it stops being served); 0 turns a region off.
    #: Rendered dashboard / failures-list bodies and API bodies kept per process.
    page_cache_entries: int = Field(default=1024, ge=0)
    #: ``/api/v1/contracts/{id}/sla`` answers kept per process (each computed once).
    figures_cache_entries: int = Field(default=512, ge=0)
    #: Bytes of complete API answers kept per process for the fast lane's replay.
    replay_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: Connections per process of the fast lane's visibility probe (in the event loop).
    probe_connections: int = Field(default=2, ge=1)
    #: Seconds a live session or read token is trusted without asking the database
    #: again: the bound within which a revocation reaches every process (``web.cache``;
    #: logging out or revoking in this process ends it at once; 0 asks every time).
    session_cache_seconds: float = 10.0
    #: Largest ``POST /api/v1/records`` batch, in records and in bytes.
    max_batch_records: int = 10_000
    max_batch_bytes: int = 16 * 1024 * 1024
    #: Threads that run request handlers (blocking database work) per process; more
    #: only adds contention for the interpreter lock.
    threads: int = Field(default=16, ge=1)
    #: Database connections of the portal role (per process; at least ``threads``).
    pool_size: int = Field(default=16, ge=1)
    max_overflow: int = Field(default=8, ge=0)


def resolve_secret(settings: WebSettings, data_dir: Path) -> bytes:
    """The cookie-signing secret: the configured one, else a key file created on first use."""
    if settings.secret_key:
        return settings.secret_key.encode()
    path = data_dir / "keys" / "web-secret"
    if path.exists():
        return path.read_text().strip().encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(48)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first
        return path.read_text().strip().encode()
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    return key.encode()
