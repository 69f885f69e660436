"""The spare zygote: forks a worker that runs a script as ``python SCRIPT`` would, reports
its exit status (signals negative, like subprocess), and takes its children down with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


@pytest.fixture()
def zygote(tmp_path: Path):
    log = (tmp_path / "zygote.log").open("ab")
    z = Zygote(sys.executable, dict(os.environ), log)
    deadline = time.monotonic() + 120
    while not z.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    assert z.ready, (tmp_path / "zygote.log").read_text()
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


def test_closing_the_zygote_kills_its_workers(zygote: Zygote, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = zygote.spawn("w1", [str(script), "sleep"], {}, tmp_path / "w1.log")
    zygote.close()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    with pytest.raises(RuntimeError):
        zygote.spawn("w2", [str(script), "0"], {}, tmp_path / "w2.log", timeout=5)
