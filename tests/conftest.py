"""Test fixtures: one real PostgreSQL per session, a fresh database per test.

The session starts the embedded PostgreSQL (or uses ``YOCO_TEST_DATABASE_URL``,
a URL of a server where the user may create databases), migrates a template
database once, and every test that asks for ``db_url`` gets its own copy of
that template (``CREATE DATABASE ... TEMPLATE``), dropped afterwards.
Tests therefore see real commits, real locks and real triggers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

#: The session fixture every database fixture stands on (``db_url``, ``empty_db_url``,
#: ``engine``, ``yoco_env`` ... all request it): a test that needs it is a ``db`` test.
_DB_ROOT_FIXTURE = "pg_admin_url"


#: The multi-process fault tests whose verdicts depend on when a fault lands (the step a
#: kill hits, a checkpoint's timing, a node's or a rank's silence), by xdist group: a group
#: runs one job after another on one worker, sent out first, while the other workers run
#: the rest of the suite (every one of them must hold under that load). Two groups of
#: about equal serial time (docs/benchmarks.md, "The test suite": ~6 min each, measured
#: 2026-12-05): the jobs on hosts in network namespaces (and the hang tests) in one, the
#: in-process jobs in the other. Two groups took as long as one while the fault jobs'
#: CPU bound the suite (20 min 03 s against 19 min 28 s - 20 min 37 s); since their CPU
#: fell by ~40 % (the kept zygotes), clean clones took 16 min 50 s with two groups and
#: 17 min 27 s with one (within the machine's hour-to-hour spread, both passing).
SERIAL_JOB_FILES: dict[str, str] = {
    "tests/runtime/test_partition_real.py": "runtime-fault-jobs-hosts",
    "tests/runtime/test_nodes.py": "runtime-fault-jobs-hosts",
    "tests/runtime/test_fencing.py": "runtime-fault-jobs-hosts",
    "tests/runtime/test_hang.py": "runtime-fault-jobs-hosts",
    "tests/runtime/test_collective_errors.py": "runtime-fault-jobs-hosts",
    "tests/runtime/test_faults_recorded.py": "runtime-fault-jobs",
    "tests/runtime/test_migration.py": "runtime-fault-jobs",
    "tests/runtime/test_transparent.py": "runtime-fault-jobs",
    "tests/runtime/test_llm_loop.py": "runtime-fault-jobs",
    "tests/adapters/test_torchrun.py": "runtime-fault-jobs",
    "tests/adapters/test_torchft.py": "runtime-fault-jobs",
}


def pytest_configure(config: pytest.Config) -> None:
    """The jobs the tests start inside this process (``runtime.supervisor.launch``) keep
    their spare zygote for the next one with the same environment
    (``runtime.zygote.keep_zygotes``): one import of torch per environment and test
    process instead of one per job (docs/benchmarks.md, "The test suite"). The jobs that
    test the zygote's start run through ``yoco run`` (a new zygote each, forked from it)."""
    from runtime.zygote import keep_zygotes

    keep_zygotes(ignore_env=("PYTEST_CURRENT_TEST",))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the db marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the database fixtures ``db`` (whatever its file is called),
    so that ``-m "not slow and not db"`` is the inner loop; put the timing-sensitive fault
    jobs (:data:`SERIAL_JOB_FILES`) in their xdist groups, first; and leave the ``gpu`` tests
    out of ordinary runs: they need CUDA devices, which this project's machines and CI do
    not have, and a skip would read as a pass. They run only through ``scripts/gpu-check``
    (which sets ``YOCO_GPU_CHECK=1`` and refuses to run without a device); the run's summary
    counts them as deselected."""
    for item in items:
        if _DB_ROOT_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)
        group = SERIAL_JOB_FILES.get(item.path.relative_to(REPO).as_posix())
        if group is not None and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            item.add_marker(pytest.mark.fault_job)
            if getattr(config.option, "loadgroup", False):  # set on xdist workers
                _name_group(item, group)
    # Stable: each part keeps its order (the group's tests still share their references).
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
    if os.environ.get("YOCO_GPU_CHECK") == "1":
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]


def _name_group(item: pytest.Item, group: str) -> None:
    """Give ``item`` the id ``<nodeid>@<group>`` that ``--dist loadgroup`` schedules by.

    pytest-xdist (3.8) appends the suffix to ``item._nodeid`` in its own collection hook,
    but pytest 9 keeps a test's id in ``item._id`` (a ``NodeId``) and ``nodeid`` reads that,
    so xdist's suffix is never seen and no test is grouped: the fault jobs then ran side by
    side, two at once. Set where pytest reads it; xdist's later suffix is harmless (the
    scheduler takes the text after the last ``@``). ``tests/test_xdist_grouping.py`` runs a
    real two-worker session to hold the scheduler to it."""
    suffixed = f"{item.nodeid}@{group}"
    if item.nodeid.endswith(f"@{group}"):
        return
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id  # pytest >= 9: where the id is kept

        item._id = coerce_node_id(suffixed)
    else:
        item._nodeid = suffixed


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
    fast = _memory_folder()
    if fast is not None:
        _remove_stale_servers(fast)
    base = Path(tempfile.mkdtemp(prefix=f"{_PG_PREFIX}{os.getpid()}-", dir=fast))
    try:
        server = start_embedded(base / "pgdata")
        try:
            url = embedded_url(server, "postgres")
            _throwaway_durability(url)
            yield url
        finally:
            server.cleanup()
    finally:
        if fast is not None:  # memory, not disk: nothing of it may outlive the run
            shutil.rmtree(base, ignore_errors=True)


_PG_PREFIX = "yoco-test-pg-"
#: The suite's server goes to a memory file system only where this much is free: its
#: data folder holds the template, the tests' databases and up to max_wal_size of WAL.
_MEMORY_NEEDED = 4 << 30


def _memory_folder() -> str | None:
    """``/dev/shm`` where it is a tmpfs with room for the suite's server, else None (the
    system's temporary folder).

    Every database test copies the template (~1,000 files) and drops its copy. On ext4,
    creating files soon after deleting thousands makes the kernel's inode allocator step
    over each recently deleted inode (``recently_deleted`` in ``find_inode_bit``, seen
    with ``perf``): one ``CREATE DATABASE`` took 0.05 s of system CPU at first and 0.3 s
    after 200 copies, ~120 CPU-seconds over a suite run; on tmpfs 0.01 s, flat
    (docs/benchmarks.md, "The test suite")."""
    shm = Path("/dev/shm")
    try:
        if not os.access(shm, os.W_OK | os.X_OK) or not shm.is_dir():
            return None
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        if not any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts):
            return None
        vfs = os.statvfs(shm)
    except OSError:
        return None
    return str(shm) if vfs.f_bavail * vfs.f_frsize >= _MEMORY_NEEDED else None


def _remove_stale_servers(folder: str) -> None:
    """Remove the data folders that crashed runs (a test process killed before its clean-up)
    left in ``folder``: a folder is named after the process that made it, and one whose
    process is gone has its server stopped (if it still runs) and is deleted."""
    from tests.runtime.netns import pid_alive

    for base in Path(folder).glob(f"{_PG_PREFIX}*-*"):
        owner = base.name[len(_PG_PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or pid_alive(int(owner)):
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            postmaster = int((base / "pgdata" / "postmaster.pid").read_text().split()[0])
            cmdline = Path(f"/proc/{postmaster}/cmdline").read_bytes()
            if str(base).encode() in cmdline:
                os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown: its data goes
        shutil.rmtree(base, ignore_errors=True)


def _throwaway_durability(url: str) -> None:
    """The suite's own server holds nothing worth an fsync: no flush to disk at each
    commit, database creation (one a test) or checkpoint. Its processes survive a test's
    crash either way (the data is in the page cache); only a machine's crash would lose
    it, and the server is thrown away with the run. (A test database was made in 0.132 s
    with them, 0.067 s without; the server's own CPU the same.) The servers the tests
    start themselves (tests/test_embedded.py) keep the defaults."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                conn.execute(text(f"ALTER SYSTEM SET {setting} = off"))
            # Checkpoints cost no fsync here; a smaller WAL keeps a server in memory small.
            conn.execute(text("ALTER SYSTEM SET max_wal_size = '256MB'"))
            conn.execute(text("SELECT pg_reload_conf()"))
    finally:
        admin.dispose()


def _with_db(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    """Name of a database migrated to head, used as the template of every test database."""
    import migrations
    from yoco.database import OWNER_ROLE, bootstrap, login_url

    name = f"yoco_tmpl_{os.getpid()}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    # The roles, and the database owned by yoco_owner, which runs the migrations.
    bootstrap(pg_admin_url, name)
    migrations.upgrade(login_url(_with_db(pg_admin_url, name), OWNER_ROLE))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own (dropped afterwards).

    It logs in as the server's superuser (for tampering, as a DBA would): the
    application's processes use :func:`app_url`, :func:`portal_url`, :func:`sink_url`.
    """
    name = f"yoco_t_{os.getpid()}_{next(_counter)}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" OWNER yoco_owner'))
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
def app_url(db_url: str) -> str:
    """The test database as the CLI's login role (``yoco_cli``, not a superuser)."""
    from yoco.database import CLI_LOGIN, login_url

    return login_url(db_url, CLI_LOGIN)


@pytest.fixture
def portal_url(db_url: str) -> str:
    """The test database as the portal's login role (``yoco_web``)."""
    from yoco.database import PORTAL_LOGIN, login_url

    return login_url(db_url, PORTAL_LOGIN)


@pytest.fixture
def sink_url(db_url: str) -> str:
    """The test database as the runtime sink's login role (``yoco_sink``)."""
    from yoco.database import SINK_LOGIN, login_url

    return login_url(db_url, SINK_LOGIN)


@pytest.fixture
def owner_url(db_url: str) -> str:
    """The test database as the owner role (migrations, the rebuild path)."""
    from yoco.database import OWNER_ROLE, login_url

    return login_url(db_url, OWNER_ROLE)


@pytest.fixture
def engine(app_url: str) -> Iterator[Engine]:
    """An engine on the test database: the CLI's login, switched to the application role."""
    from yoco.database import make_engine

    eng = make_engine(app_url)
    yield eng
    eng.dispose()


@pytest.fixture
def rebuild_engine(owner_url: str) -> Iterator[Engine]:
    """An engine as the owner role: the rebuild path, the one that may rewrite projections."""
    from yoco.database import make_engine

    eng = make_engine(owner_url, app_role=False)
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
def yoco_env(
    app_url: str,
    owner_url: str,
    portal_url: str,
    sink_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    """Environment under which ``yoco`` uses the test database and a private data dir."""
    from yoco.settings import get_settings

    env = {
        "DATABASE_URL": app_url,
        "YOCO_OWNER_DATABASE_URL": owner_url,
        "YOCO_PORTAL_DATABASE_URL": portal_url,
        "YOCO_SINK_DATABASE_URL": sink_url,
        "YOCO_DATA_DIR": str(tmp_path / "yoco-data"),
    }
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
