"""The spare zygote: forks a worker that runs a script as ``python SCRIPT`` would, reports
its exit status (signals negative, like subprocess), and takes its children down with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.zygote import Zygote

SCRIPT = """
import os, sys, time
print("argv", sys.argv[1:], "env", os.environ.get("YOCO_TEST_VALUE"), flush=True)
print("main", __name__, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
if sys.argv[1] == "raise":
    raise ValueError("boom from the script")
sys.exit(int(sys.argv[1]))
"""


def _start(where: Path):
    log = (where / "zygote.log").open("ab")
    z = Zygote(sys.executable, dict(os.environ), log)
    assert z.wait_ready(120), (where / "zygote.log").read_text()
    return z, log


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory):
    """One zygote for the tests that leave it serving (each starts its own children)."""
    z, log = _start(tmp_path_factory.mktemp("zygote"))
    yield z
    z.close()
    log.close()


@pytest.fixture()
def own_zygote(tmp_path: Path):
    """A zygote of the test's own (it closes it)."""
    z, log = _start(tmp_path)
    yield z
    z.close()
    log.close()


def test_forked_worker_runs_the_script_and_reports_its_exit(zygote: Zygote,
                                                           tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    log = tmp_path / "w1.log"
    proc = zygote.spawn("w1", [str(script), "3"], {"YOCO_TEST_VALUE": "abc"}, log)
    assert proc.wait(timeout=30) == 3
    text = log.read_text()
    assert "w1 forked by the spare zygote" in text
    assert "argv ['3'] env abc" in text and "main __main__" in text

    ok = zygote.spawn("w2", [str(script), "0"], {}, tmp_path / "w2.log")
    assert ok.wait(timeout=30) == 0

    bad = zygote.spawn("w3", [str(script), "raise"], {}, tmp_path / "w3.log")
    assert bad.wait(timeout=30) == 1
    assert "ValueError: boom from the script" in (tmp_path / "w3.log").read_text()


def test_killed_worker_reports_the_signal_and_wait_times_out(zygote: Zygote,
                                                             tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = zygote.spawn("w1", [str(script), "sleep"], {}, tmp_path / "w1.log")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.kill()  # already reaped: nothing happens


def test_a_fork_given_up_on_is_killed_when_it_comes(zygote: Zygote, tmp_path: Path) -> None:
    # spawn() gave up waiting for the fork (its caller then starts a new process for the
    # slot): the child the zygote forks later must not run on as a second w1.
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    # The zygote is stopped while spawn() waits, so the fork comes after spawn() has given
    # up, whatever the machine's load (with a running zygote and timeout=0, a fast fork
    # could be reported first and spawn() would rightly succeed).
    os.kill(zygote._proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(RuntimeError, match="did not fork w1"):
            zygote.spawn("w1", [str(script), "sleep"], {}, tmp_path / "w1.log", timeout=0.2)
    finally:
        os.kill(zygote._proc.pid, signal.SIGCONT)
    with zygote.cond:
        assert zygote.cond.wait_for(lambda: -signal.SIGKILL in zygote._exits.values(), 30)
    assert "w1" not in zygote._pids
    ok = zygote.spawn("w2", [str(script), "0"], {}, tmp_path / "w2.log")
    assert ok.wait(timeout=30) == 0  # the zygote serves on


def test_closing_the_zygote_kills_its_workers(own_zygote: Zygote, tmp_path: Path) -> None:
    zygote = own_zygote
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = zygote.spawn("w1", [str(script), "sleep"], {}, tmp_path / "w1.log")
    zygote.close()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    with pytest.raises(RuntimeError):
        zygote.spawn("w2", [str(script), "0"], {}, tmp_path / "w2.log", timeout=5)
