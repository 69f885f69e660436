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
    zygote.kill()  # (a fenced agent's way) ended already: nothing to signal, no error


# A zygote forked from the process that runs the job (runtime.zygote.prefork): what its
# workers do must be what ``python SCRIPT`` does, though the frames of the program that
# forked it (``yoco run``: click's, typer's) are on their stack.

ENDINGS = """
import atexit, sys, threading, time
case = sys.argv[1]
print("start", case, flush=True)
if case == "ok":  # the interpreter's shutdown: threads joined, then atexit
    def late():
        time.sleep(0.3)
        print("thread joined before the end", flush=True)
    threading.Thread(target=late).start()
    atexit.register(print, "atexit ran", flush=True)
elif case == "exit3":
    sys.exit(3)
elif case == "exit_message":
    sys.exit("a message for stderr")
elif case == "raise":
    raise ValueError("boom from the script")
elif case == "interrupt":
    raise KeyboardInterrupt
"""

#: What the program that forks the zygote looks like from a worker's stack: a CLI that
#: catches exceptions and says so, as click does with KeyboardInterrupt ("Aborted!").
DRIVER = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch  # what ``yoco run`` has imported when it forks
from runtime.zygote import Zygote, prefork

def cli():
    where, script = Path(sys.argv[2]), sys.argv[3]
    forked = prefork()
    try:
        zlog = (where / "zygote.log").open("ab")
        z = Zygote(sys.executable, dict(os.environ), zlog)
        assert z.wait_ready(120)
        rcs = {}
        for case in sys.argv[4:]:
            proc = z.spawn(case, [script, case], {}, where / f"{case}.log")
            rcs[case] = proc.wait(timeout=60)
        z.close()
        print(json.dumps({"forked": forked, "preforked": z.preforked, "rcs": rcs}))
    except KeyboardInterrupt:
        print("Aborted! (the CLI caught it)", flush=True)
        sys.exit(1)
    except Exception as exc:
        print(f"the CLI caught {exc!r}", flush=True)
        sys.exit(2)

cli()
"""

CASES = ["ok", "exit3", "exit_message", "raise", "interrupt"]


def test_a_zygote_forked_at_start_up_ends_each_script_as_python_does(tmp_path: Path
                                                                    ) -> None:
    script = tmp_path / "endings.py"
    script.write_text(ENDINGS)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    repo = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, str(driver), repo, str(tmp_path), str(script),
                          *CASES], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["forked"] and got["preforked"], got
    assert "forked from pid" in (tmp_path / "zygote.log").read_text()
    for case in CASES:
        plain = subprocess.run([sys.executable, str(script), case], capture_output=True,
                               text=True, timeout=60)
        log = (tmp_path / f"{case}.log").read_text()
        assert got["rcs"][case] == plain.returncode, (case, log)
        for line in (plain.stdout + plain.stderr).splitlines():
            if line.strip() and not line.startswith("  "):  # not the traceback's frames
                assert line in log, (case, line, log)
        assert "the CLI caught" not in log and "Aborted!" not in log, (case, log)
    assert got["rcs"]["interrupt"] == -signal.SIGINT
    ok = (tmp_path / "ok.log").read_text()
    assert ok.index("thread joined before the end") < ok.index("atexit ran")
    assert "the CLI caught" not in out.stdout and "Aborted!" not in out.stdout


def test_a_zygote_asked_for_with_another_environment_is_started_anew(tmp_path: Path
                                                                    ) -> None:
    # torch reads some variables when it is imported: a zygote forked before the job's
    # environment was known would not be the one asked for.
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.replace("dict(os.environ)",
                                     "{**os.environ, 'YOCO_TEST_EXTRA': '1'}"))
    script = tmp_path / "endings.py"
    script.write_text(ENDINGS)
    repo = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, str(driver), repo, str(tmp_path), str(script),
                          "exit3"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"forked": True, "preforked": False, "rcs": {"exit3": 3}}
    assert "forked from pid" not in (tmp_path / "zygote.log").read_text()


def test_no_zygote_is_forked_while_another_thread_runs() -> None:
    import threading

    from runtime import zygote as z

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert z.prefork() is False
        assert z._fork is None
    finally:
        stop.set()
        t.join()


# Zygotes kept for the next job of the process (runtime.zygote.keep_zygotes; the test
# suite keeps them: tests/conftest.py).

ENV_SCRIPT = """
import os, sys
print("value", os.environ.get("YOCO_TEST_VALUE"), "only-first",
      os.environ.get("YOCO_TEST_ONLY_FIRST"), flush=True)
"""


def test_a_kept_zygote_serves_the_next_job_with_that_jobs_whole_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import zygote as z
    from runtime.processes import WorkerPool

    monkeypatch.setattr(z, "_kept", {})
    z.keep_zygotes(ignore_env=("PYTEST_CURRENT_TEST",))
    script = tmp_path / "env.py"
    script.write_text(ENV_SCRIPT)
    base = dict(os.environ)
    pids, outs = [], []
    for job, env in enumerate([{**base, "YOCO_TEST_VALUE": "a", "YOCO_TEST_ONLY_FIRST": "1"},
                               {**base, "YOCO_TEST_VALUE": "b"}]):
        logs = tmp_path / f"job{job}"
        logs.mkdir()
        pool = WorkerPool(python=sys.executable, script=str(script), args=[], log_dir=logs)
        # The zygote is keyed by the environment it starts with (torch reads some of it
        # when imported); the workers' own environments differ, as a job's do.
        pool.start_zygote(base)
        assert pool.zygote is not None
        pids.append(pool.zygote.pid)
        pool.spawn("w0", env)
        assert pool.procs["w0"].wait(timeout=60) == 0
        pool.shutdown()
        outs.append((logs / "w0.log").read_text())
    assert pids[0] == pids[1]  # the second job forked from the first one's zygote
    assert "value a only-first 1" in outs[0]
    assert "value b only-first None" in outs[1]  # nothing of the first job's environment
    assert "kept from an earlier job" in (tmp_path / "job1" / "zygote.log").read_text()
    other = WorkerPool(python=sys.executable, script=str(script), args=[],
                       log_dir=tmp_path)
    other.start_zygote({**base, "OMP_NUM_THREADS": "1"})  # another environment: its own
    assert other.zygote is not None and other.zygote.pid != pids[0]
    other.shutdown()
    for kept in z._kept.values():
        kept.close()


def test_without_keeping_each_job_starts_and_ends_its_own_zygote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import zygote as z
    from runtime.processes import WorkerPool

    monkeypatch.setattr(z, "_keep", None)
    pool = WorkerPool(python=sys.executable, script="x.py", args=[], log_dir=tmp_path)
    pool.start_zygote(dict(os.environ))
    assert pool.zygote is not None and pool.zygote.wait_ready(120)
    pool.shutdown()
    assert not pool.zygote.alive or pool.zygote._proc.poll() is not None
