"""Alembic migrations for the whole schema, and helpers to run them from code."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy import MetaData
    from sqlalchemy.engine import Connection

HERE = Path(__file__).resolve().parent


def target_metadata() -> MetaData:
    """The metadata of every package's models (imported here, not at import time)."""
    import alerts.models  # noqa: F401
    import billing.models  # noqa: F401
    import ledger.models
    import reports.models  # noqa: F401
    import web.models  # noqa: F401

    return ledger.models.Base.metadata


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic config pointing at this package, for ``url`` or an open ``connection``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at ``url`` down to ``revision``."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database at ``url`` is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    """The newest revision in this package."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
