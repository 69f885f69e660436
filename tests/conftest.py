"""Test fixtures: one real PostgreSQL per session, a fresh database per test.

The session starts the embedded PostgreSQL (or uses ``YOCO_TEST_DATABASE_URL``,
a URL of a server where the user may create databases), migrates a template
database once, and every test that asks for ``db_url`` gets its own copy of
that template (``CREATE DATABASE ... TEMPLATE``, ~0.1 s), dropped afterwards.
Tests therefore see real commits, real locks and real triggers.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

REPO = Path(__file__).resolve().parents[1]
TESTDATA = REPO / "tests" / "data"
_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A superuser URL of the test server's ``postgres`` database."""
    from yoco.database import embedded_url, start_embedded
    from yoco.settings import normalize_url

    given = os.environ.get("YOCO_TEST_DATABASE_URL")
    if given:
        yield normalize_url(given)
        return
    base = Path(tempfile.mkdtemp(prefix="yoco-test-pg-"))
    server = start_embedded(base / "pgdata")
    try:
        yield embedded_url(server, "postgres")
    finally:
        server.cleanup()


def _with_db(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    """Name of a database migrated to head, used as the template of every test database."""
    import migrations

    name = f"yoco_tmpl_{os.getpid()}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    migrations.upgrade(_with_db(pg_admin_url, name))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own (dropped afterwards)."""
    name = f"yoco_t_{os.getpid()}_{next(_counter)}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    try:
        yield _with_db(pg_admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """URL of a fresh database with no schema at all (for migration tests)."""
    name = f"yoco_e_{os.getpid()}_{next(_counter)}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield _with_db(pg_admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on the test database, connected as the application role."""
    from yoco.database import make_engine

    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def owner_engine(db_url: str) -> Iterator[Engine]:
    """An engine on the test database as the superuser (to tamper, as an attacker would)."""
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """A session on the test database; the test commits what it wants to keep."""
    with Session(engine) as s:
        yield s


@pytest.fixture
def yoco_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment under which ``yoco`` uses the test database and a private data dir."""
    from yoco.settings import get_settings

    env = {"DATABASE_URL": db_url, "YOCO_DATA_DIR": str(tmp_path / "yoco-data")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    yield env
    get_settings.cache_clear()


@pytest.fixture
def testdata() -> Path:
    """The vendored conformance vectors (``tests/data``); their absence is a failure."""
    path = TESTDATA
    assert path.is_dir(), f"vendored test data missing at {path}"
    return path
