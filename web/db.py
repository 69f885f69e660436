"""The portal's two ways into the database.

- ``read(principal)``: a session as the role ``yoco_portal`` (SELECT only, row-level
  security on), in one transaction whose settings ``yoco.customer`` / ``yoco.scope`` name
  the caller's tenant (``SET LOCAL``: they end with the transaction, so a pooled
  connection never carries them to the next request).
- ``write()``: a unit of work as the application role (users, sessions, tokens, ingest,
  billing actions); callers check tenancy first, through ``read``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from web.accounts import Principal

PORTAL_ROLE = "yoco_portal"


def portal_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose every connection has switched to the ``yoco_portal`` role."""
    kwargs.setdefault("pool_recycle", 1800)
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _set_role(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET ROLE {PORTAL_ROLE}")
        dbapi_conn.commit()

    return engine


def scope_settings(principal: Principal) -> tuple[str, str]:
    """The (``yoco.customer``, ``yoco.scope``) values of a principal's transactions."""
    if principal.is_staff:
        return "", "all"
    return principal.customer or "", ""


class PortalDb:
    """The portal role's engine and the application role's engine of one app."""

    def __init__(self, app_engine: Engine, read_engine: Engine) -> None:
        self.app_engine = app_engine
        self.read_engine = read_engine
        self._read = sessionmaker(bind=read_engine, expire_on_commit=False)
        self._write = sessionmaker(bind=app_engine, expire_on_commit=False)

    @contextmanager
    def read(self, principal: Principal) -> Iterator[Session]:
        """A read-only session scoped to ``principal``'s tenant by row-level security."""
        customer, scope = scope_settings(principal)
        session = self._read()
        try:
            session.execute(
                text(
                    "SELECT set_config('yoco.customer', :c, true), "
                    "set_config('yoco.scope', :s, true)"
                ),
                {"c": customer, "s": scope},
            )
            yield session
        finally:
            session.rollback()
            session.close()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A unit of work as the application role: committed on success, else rolled back."""
        session = self._write()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.read_engine.dispose()
        self.app_engine.dispose()
