"""The embedded PostgreSQL: started on demand, stopped by the last user, recovered after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

#: Every test here starts its own embedded server (no database fixture to mark it by).
pytestmark = pytest.mark.db

YOCO = [sys.executable, "-m", "yoco.cli"]


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env["YOCO_DATA_DIR"] = str(data_dir)
    return env


def _server_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    if not pidfile.exists():
        return None
    pid = int(pidfile.read_text().splitlines()[0])
    return pid if psutil.pid_exists(pid) else None


def _wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def data_dir(tmp_path: Path):
    d = tmp_path / "data"
    yield d
    pid = _server_pid(d / "pgdata")
    if pid:  # never leave a server behind, whatever the test did
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid)


def test_starts_on_demand_and_stops_when_the_last_user_leaves(data_dir: Path) -> None:
    out = subprocess.run(
        [*YOCO, "db", "upgrade"], env=_env(data_dir), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "→ " in out.stdout
    url = subprocess.run(
        [*YOCO, "db", "url"], env=_env(data_dir), capture_output=True, text=True, timeout=120
    )
    assert url.returncode == 0 and str(data_dir / "pgdata") in url.stdout.replace("%2F", "/")
    assert _server_pid(data_dir / "pgdata") is None  # stopped cleanly at exit


def test_recovers_after_the_owning_process_was_sigkilled(data_dir: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from yoco.database import open_database; "
            "db = open_database(); print(db.url, flush=True); time.sleep(600)",
        ],
        env=_env(data_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("postgresql")
        server = _server_pid(data_dir / "pgdata")
        assert server is not None
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # The orphaned server still runs, and the dead pid is still listed as a user.
        assert _server_pid(data_dir / "pgdata") == server
        handles = json.loads((data_dir / "pgdata" / ".handle_pids.json").read_text())
        assert holder.pid in handles
        out = subprocess.run(
            [*YOCO, "db", "upgrade"],
            env=_env(data_dir),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        # The next user reattached, dropped the stale handle and stopped the server at exit.
        assert _wait_gone(server)
        assert _server_pid(data_dir / "pgdata") is None
        again = subprocess.run(
            [*YOCO, "contracts", "list"],
            env=_env(data_dir),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr
    finally:
        if holder.poll() is None:
            holder.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


@pytest.mark.slow
def test_sigterm_to_yoco_serve_stops_the_embedded_server(data_dir: Path) -> None:
    # What systemd and Kubernetes send: `kill PID`. The portal stops gracefully and the
    # embedded PostgreSQL is stopped with it, leaving no stale handle behind.
    up = subprocess.run(
        [*YOCO, "db", "upgrade"], env=_env(data_dir), capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stderr
    port = _free_port()
    serve = subprocess.Popen(
        [*YOCO, "serve", "--port", str(port), "--close-due-every", "0"],
        env=_env(data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/login", serve)
        server = _server_pid(data_dir / "pgdata")
        assert server is not None
        handles = json.loads((data_dir / "pgdata" / ".handle_pids.json").read_text())
        assert serve.pid in handles
        serve.send_signal(signal.SIGTERM)
        _, stderr = serve.communicate(timeout=60)
        assert serve.returncode == 0, stderr
        assert _wait_gone(server), "the embedded PostgreSQL outlived yoco serve"
        assert _server_pid(data_dir / "pgdata") is None
        handles_file = data_dir / "pgdata" / ".handle_pids.json"
        if handles_file.exists():
            assert serve.pid not in json.loads(handles_file.read_text() or "[]")
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)


def test_yoco_serve_on_a_busy_port_exits_2_naming_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [*YOCO, "serve", "--port", str(port)],
            env=_env(tmp_path / "data"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert not (tmp_path / "data" / "pgdata").exists()  # refused before starting anything


@pytest.mark.slow
def test_the_demo_runs_on_a_fresh_data_folder(data_dir: Path) -> None:
    # What a newcomer types after the set-up: no DATABASE_URL, nothing in the data folder.
    # The schema must be created by the owner (the CLI's own login may not create tables).
    env = {k: v for k, v in _env(data_dir).items()
           if not (k.startswith("YOCO_") and k.endswith("DATABASE_URL"))}
    out = subprocess.run(
        [*YOCO, "demo", "--contracts", "1", "--records", "100", "--no-training"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "schema migrated to" in out.stdout and "done in" in out.stdout
    assert list((data_dir / "demo" / "reports").glob("*.pdf"))
