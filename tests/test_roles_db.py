"""Database roles: no process logs in as a superuser; nobody but the rebuild path edits projections.

Every role is tried on every table: UPDATE, DELETE and TRUNCATE of the journal and of
each projection are refused to the application role (the CLI's, the portal's and the
sink's logins after their SET ROLE), to the portal's read role and to the bare login
roles; the owner (``yoco ledger rebuild``) may rewrite projections but not the journal.
The four projections with state accept an UPDATE of their state columns from the
application role only as a journal entry appended to the log says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from billing.models import TABLES as BILLING_TABLES
from ledger.models import APPEND_ONLY_TABLES, PROJECTION_TABLES
from reports.models import TABLES as ISSUED_TABLES
from tests.billing.test_verify_projections_db import _rich_ledger
from yoco.database import (
    CLI_LOGIN,
    OWNER_ROLE,
    PORTAL_LOGIN,
    SINK_LOGIN,
    SuperuserLogin,
    login_url,
    make_engine,
)

JOURNAL = (*APPEND_ONLY_TABLES, "ledger_logs", *ISSUED_TABLES)
PROJECTIONS = (*PROJECTION_TABLES, *BILLING_TABLES)
WHO = "SELECT session_user, current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = session_user)"


@pytest.fixture
def rich(engine: Engine, close: Any) -> Engine:
    _rich_ledger(engine, close)
    return engine


@pytest.fixture
def close(engine: Engine) -> Any:
    from datetime import datetime

    from billing.closing import close_year
    from ledger.note import Signer, generate_signer
    from tests.billing.conftest import AFTER_Y1
    from yoco.database import unit_of_work

    signer = Signer.from_text(generate_signer("test.example/log")[0])

    def run(cid: str = "C-1", year: int = 1, now: datetime = AFTER_Y1) -> Any:
        with unit_of_work(engine) as s:
            return close_year(s, cid, year, now=now, signer=signer, origin_prefix="test.example/log")

    return run


@pytest.fixture
def engines(db_url: str, owner_url: str) -> Iterator[dict[str, Engine]]:
    """Every role a process of yoco can act as, each on its own engine."""
    from web.db import portal_engine

    made = {
        "yoco_app as yoco_cli": make_engine(login_url(db_url, CLI_LOGIN)),
        "yoco_app as yoco_web": make_engine(login_url(db_url, PORTAL_LOGIN)),
        "yoco_app as yoco_sink": make_engine(login_url(db_url, SINK_LOGIN)),
        "yoco_portal as yoco_web": portal_engine(login_url(db_url, PORTAL_LOGIN)),
        "bare yoco_cli": create_engine(login_url(db_url, CLI_LOGIN)),
        "bare yoco_web": create_engine(login_url(db_url, PORTAL_LOGIN)),
        "bare yoco_sink": create_engine(login_url(db_url, SINK_LOGIN)),
    }
    yield made
    for e in made.values():
        e.dispose()


def _refused(engine: Engine, sql: str) -> bool:
    try:
        with engine.begin() as c:
            c.execute(text("SELECT set_config('yoco.scope', 'all', true)"))
            c.execute(text(sql))
    except DBAPIError as exc:
        assert exc.orig is not None and exc.orig.sqlstate == "42501", exc  # insufficient_privilege
        return True
    return False


@pytest.mark.parametrize("table", [*JOURNAL, *PROJECTIONS])
def test_no_application_role_may_update_delete_or_truncate(
    rich: Engine, engines: dict[str, Engine], table: str
) -> None:
    allowed = []
    for who, engine in engines.items():
        for sql in (
            f"UPDATE {table} SET {_any_column(rich, table)} = {_any_column(rich, table)}",
            f"DELETE FROM {table}",
            f"TRUNCATE {table} CASCADE",
        ):
            if not _refused(engine, sql):
                allowed.append((who, sql))
    assert allowed == []


def _any_column(engine: Engine, table: str) -> str:
    with engine.connect() as c:
        return str(
            c.execute(
                text(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = :t "
                    "AND is_generated = 'NEVER' ORDER BY ordinal_position DESC LIMIT 1"
                ),
                {"t": table},
            ).scalar_one()
        )


def test_the_state_columns_change_only_as_a_journal_entry_says(rich: Engine) -> None:
    """The application role's column grants, and the guard that refuses unjustified steps."""
    attempts = {
        "a span closed by no job_finished": "UPDATE job_spans SET finished_at = now(), "
        "finish_event_id = gen_random_uuid() WHERE finished_at IS NULL",
        "a closed span re-closed": "UPDATE job_spans SET finished_at = finished_at "
        "WHERE finished_at IS NOT NULL",
        "a decided dispute reopened": "UPDATE billing_disputes SET status = 'open' "
        "WHERE status <> 'open'",
        "a credit's balance edited": "UPDATE billing_credits SET applied_minor = 0",
        "a credit voided by no credit_void": "UPDATE billing_credits SET status = 'void', "
        "void_event_id = gen_random_uuid()",
        "a year's verdict flipped": "UPDATE billing_years SET guarantee_met = NOT guarantee_met",
        "a pending mark cleared": "UPDATE billing_years SET pending_seq = NULL, "
        "pending_event_id = NULL WHERE pending_seq IS NOT NULL",
        "a key column": "UPDATE billing_credits SET contract_id = 'C-2'",
        "a log's id": "UPDATE ledger_logs SET log_id = log_id",
    }
    with rich.connect() as c:
        counts = {
            "open spans": c.execute(
                text("SELECT count(*) FROM job_spans WHERE finished_at IS NULL")
            ).scalar_one(),
            "pending years": c.execute(
                text("SELECT count(*) FROM billing_years WHERE pending_seq IS NOT NULL")
            ).scalar_one(),
        }
    assert counts["open spans"] and counts["pending years"]  # every guard has a row to try
    passed = [name for name, sql in attempts.items() if not _refused(rich, sql)]
    assert passed == []


def test_the_owner_is_the_rebuild_path_but_cannot_edit_the_journal(
    rich: Engine, owner_url: str
) -> None:
    owner = make_engine(owner_url, app_role=False)
    try:
        with owner.connect() as c:
            assert c.execute(text(WHO)).one() == (OWNER_ROLE, OWNER_ROLE, False)
        for table in PROJECTIONS:
            assert not _refused(owner, f"DELETE FROM {table} WHERE false")
        assert not _refused(owner, "UPDATE billing_years SET guarantee_met = guarantee_met")
        for table in APPEND_ONLY_TABLES:
            assert _refused(owner, f"UPDATE {table} SET log_id = log_id")
            assert _refused(owner, f"DELETE FROM {table}")
            assert _refused(owner, f"TRUNCATE {table} CASCADE")
    finally:
        owner.dispose()


def test_no_process_logs_in_as_a_superuser(
    rich: Engine, yoco_env: dict[str, str], tmp_path: Any
) -> None:
    """The CLI's, the portal's and the sink's connections, as the server sees them."""
    from web.portal import Portal
    from web.settings import WebSettings
    from yoco.app import App
    from yoco.settings import Settings
    from yoco.sink import ledger_sink

    ctx = App(Settings())
    portal = Portal(ctx, WebSettings(secret_key="t"))
    sink = ledger_sink()
    try:
        seen = {}
        for name, engine in {
            "cli": ctx.engine,
            "portal writes": portal.db.app_engine,
            "portal reads": portal.db.read_engine,
            "sink": sink.engine,
        }.items():
            with engine.connect() as c:
                seen[name] = tuple(c.execute(text(WHO)).one())
    finally:
        portal.close()
        ctx.close()
    assert seen == {
        "cli": (CLI_LOGIN, "yoco_app", False),
        "portal writes": (PORTAL_LOGIN, "yoco_app", False),
        "portal reads": (PORTAL_LOGIN, "yoco_portal", False),
        "sink": (SINK_LOGIN, "yoco_app", False),
    }


def test_a_superuser_url_is_refused_with_a_clear_error(db_url: str) -> None:
    from web.db import portal_engine

    for engine in (make_engine(db_url), portal_engine(db_url)):
        with pytest.raises(SuperuserLogin, match="superuser"), engine.connect():
            pass
        engine.dispose()


def test_the_cli_refuses_a_superuser_database_url(
    yoco_env: dict[str, str], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from yoco.cli import build_app
    from yoco.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", db_url)
    get_settings.cache_clear()
    out = CliRunner().invoke(build_app(), ["contracts", "list"])
    assert out.exit_code == 2
    assert "superuser" in out.output and "yoco_cli" in out.output


def test_a_database_from_before_the_roles_is_handed_to_the_owner(
    empty_db_url: str, pg_admin_url: str
) -> None:
    """An installation migrated by a superuser (before 0004) upgrades: the owner takes over."""
    from sqlalchemy.engine import make_url

    import migrations
    from yoco.database import bootstrap

    migrations.upgrade(empty_db_url, "0006")  # as the superuser, as installations were
    name = make_url(empty_db_url).database
    assert name is not None
    bootstrap(pg_admin_url, name)
    owner = login_url(empty_db_url, OWNER_ROLE)
    migrations.upgrade(owner)
    assert migrations.current(login_url(empty_db_url, CLI_LOGIN)) == migrations.head_revision()
    eng = create_engine(empty_db_url)
    try:
        with eng.connect() as c:
            others = c.execute(
                text(
                    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind = 'r' "
                    "AND pg_get_userbyid(c.relowner) <> :o"
                ),
                {"o": OWNER_ROLE},
            ).scalars().all()
            db_owner = c.execute(
                text(
                    "SELECT pg_get_userbyid(datdba) FROM pg_database "
                    "WHERE datname = current_database()"
                )
            ).scalar_one()
    finally:
        eng.dispose()
    assert others == [] and db_owner == OWNER_ROLE
    app = make_engine(login_url(empty_db_url, CLI_LOGIN))
    try:
        assert _refused(app, "DELETE FROM outcomes")
    finally:
        app.dispose()
