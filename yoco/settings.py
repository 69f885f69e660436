"""Settings of the composition root, read lazily from the environment.

Nothing is read at import time: :func:`get_settings` builds the one
:class:`Settings` object on first use, so tests and the CLI can change the
environment before anything looks at it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger.cadence import CHECKPOINT_EVERY


def _default_data_dir() -> Path:
    # The embedded server opens every parent folder of its data dir to other
    # users (o+rx) because it runs as a separate system user; a folder under the
    # user's data directory keeps that to a predictable, documented place.
    return Path(platformdirs.user_data_dir("yoco", appauthor=False))


class Settings(BaseSettings):
    """Where yoco keeps its state and which database it talks to."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", case_sensitive=False)

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    #: Logins of the other processes on the server of ``DATABASE_URL`` (default: it).
    owner_database_url: str | None = Field(default=None, validation_alias="YOCO_OWNER_DATABASE_URL")
    portal_database_url: str | None = Field(
        default=None, validation_alias="YOCO_PORTAL_DATABASE_URL"
    )
    sink_database_url: str | None = Field(default=None, validation_alias="YOCO_SINK_DATABASE_URL")
    data_dir: Path = Field(default_factory=_default_data_dir, validation_alias="YOCO_DATA_DIR")
    signing_key_path: Path | None = Field(default=None, validation_alias="YOCO_SIGNING_KEY")
    log_origin: str = Field(default="yoco.example/ledger", validation_alias="YOCO_LOG_ORIGIN")
    #: Every log with new entries gets a signed checkpoint within this many seconds
    #: (``yoco serve``'s scheduler, the deploy/ timers); the portal states it to customers
    #: waiting for a proof. Default :data:`ledger.cadence.CHECKPOINT_EVERY`.
    checkpoint_every_s: int = Field(
        default=int(CHECKPOINT_EVERY.total_seconds()), gt=0, le=86400,
        validation_alias="YOCO_LEDGER_CHECKPOINT_EVERY_S",
    )
    #: Witnesses (docs/audit.md): comma-separated ``URL VKEY`` pairs; each new checkpoint
    #: is submitted to them (:mod:`ledger.witnessing`), and ``yoco ledger verify`` compares
    #: the database with what they cosigned.
    witnesses: str = Field(default="", validation_alias="YOCO_WITNESSES")
    #: The global policy: how many of the witnesses must cosign a checkpoint (k of n;
    #: default: all of them).
    witness_quorum: int | None = Field(default=None, ge=0, validation_alias="YOCO_WITNESS_QUORUM")
    #: Each request to a witness gives up after this many seconds (a witness down delays
    #: cosigning, never ingest).
    witness_timeout_s: float = Field(default=5.0, gt=0, le=120,
                                     validation_alias="YOCO_WITNESS_TIMEOUT_S")
    #: Alerts (docs/alerts.md): a log with entries under no signed checkpoint newer than
    #: this many seconds raises ``checkpoint_stale``.
    alerts_checkpoint_max_age_s: int = Field(
        default=3600, gt=0, validation_alias="YOCO_ALERTS_CHECKPOINT_MAX_AGE_S"
    )
    #: Tries per delivery, the first backoff and its cap (seconds), and each try's timeout.
    alerts_max_attempts: int = Field(default=5, ge=1, le=20,
                                     validation_alias="YOCO_ALERTS_MAX_ATTEMPTS")
    alerts_backoff_s: float = Field(default=1.0, gt=0, validation_alias="YOCO_ALERTS_BACKOFF_S")
    alerts_backoff_cap_s: float = Field(default=60.0, gt=0, le=3600,
                                        validation_alias="YOCO_ALERTS_BACKOFF_CAP_S")
    alerts_timeout_s: float = Field(default=10.0, gt=0, le=300,
                                    validation_alias="YOCO_ALERTS_TIMEOUT_S")
    #: E-mail every issued report (monthly report, year-end statement) to the contract's
    #: subscribers: the destinations that name the opt-in kind ``report_issued``.
    alerts_report_emails: bool = Field(default=False,
                                       validation_alias="YOCO_ALERTS_REPORT_EMAILS")

    @field_validator(
        "database_url", "owner_database_url", "portal_database_url", "sink_database_url"
    )
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql+psycopg://", "postgresql://", "postgres://")):
            raise ValueError(
                "DATABASE_URL must be a PostgreSQL URL such as "
                "postgresql+psycopg://user:password@host:5432/dbname"
            )
        return normalize_url(value)

    @field_validator("witnesses")
    @classmethod
    def _check_witnesses(cls, value: str) -> str:
        from ledger.witnessing import parse_witnesses

        parse_witnesses(value)  # ValueError names the entry
        return value

    @property
    def pgdata(self) -> Path:
        """The folder of the embedded PostgreSQL cluster."""
        return self.data_dir / "pgdata"

    @property
    def signer_key_file(self) -> Path:
        """The Ed25519 checkpoint signer key file (outside the database)."""
        return self.signing_key_path or (self.data_dir / "keys" / "checkpoint-signer.key")


def normalize_url(url: str) -> str:
    """Return ``url`` with the psycopg 3 driver named, as SQLAlchemy needs it."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class SettingsError(ValueError):
    """A setting from the environment is malformed; the message names the variable."""


def load_settings() -> Settings:
    """The settings from the environment, or :class:`SettingsError` naming each malformed
    variable and why (never a validation traceback: a typo in ``DATABASE_URL`` is bad
    input like any other)."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            name = ".".join(str(part) for part in e.get("loc", ())) or "settings"
            message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            problems.append(message if message.startswith(name) else f"{name}: {message}")
        raise SettingsError("; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Build (once) and return the process-wide settings (:func:`load_settings`)."""
    return load_settings()
