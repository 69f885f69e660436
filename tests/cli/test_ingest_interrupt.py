"""Ctrl-C during `yoco ledger ingest`: nothing written, said so, exit status 130.

A real ``yoco`` process and a real SIGINT, sent once the ingest's transaction holds the
logs' locks (it has a transaction id: the append has begun); the journal is then
unchanged, and the same command afterwards ingests the whole file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from tests import factories as f
from yoco.cli import build_app

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 2, 1, tzinfo=UTC)
LINES = 60_000


def _write(path: Path) -> None:
    """One job's start, then progress records: a file that takes a while to append."""
    with path.open("w") as fh:
        fh.write(json.dumps(f.rec("job_started", "INT-1", T0, job_id="j", gpus=8)) + "\n")
        for i in range(1, LINES):
            rec = f.rec("job_progress", "INT-1", T0 + timedelta(seconds=i), job_id="j", step=i,
                        step_seconds=1.0)
            fh.write(json.dumps(rec) + "\n")


def _entries(url: str) -> int:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())
    finally:
        eng.dispose()


def test_ctrl_c_during_the_append_writes_nothing_and_says_so(
    yoco_env, db_url, tmp_path
) -> None:
    contracts = tmp_path / "c.json"
    contracts.write_text(json.dumps([f.contract("INT-1", start_date="2026-01-01")]))
    out = CliRunner().invoke(build_app(), ["contracts", "import", str(contracts)])
    assert out.exit_code == 0, out.output
    data = tmp_path / "records.jsonl"
    _write(data)
    before = _entries(db_url)

    proc = subprocess.Popen(
        [sys.executable, "-m", "yoco.cli", "ledger", "ingest", str(data)],
        env={**os.environ, **yoco_env}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    watcher = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        # Wait (on a monotonic clock, bounded) until the ingest's transaction has an id.
        deadline = time.monotonic() + 300
        writing = False
        while not writing and proc.poll() is None and time.monotonic() < deadline:
            with watcher.connect() as c:
                writing = bool(c.execute(text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE usename = 'yoco_cli' AND backend_xid IS NOT NULL"
                )).scalar_one())
            if not writing:
                time.sleep(0.02)
        if not writing:
            proc.kill()
            raise AssertionError(f"the ingest never began to write: {proc.communicate()}")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        watcher.dispose()
    assert proc.returncode == 130, (proc.returncode, stdout, stderr)
    assert "interrupted" in stderr and "nothing written" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert _entries(db_url) == before

    # Nothing half-written stands in the way: the same command ingests the whole file.
    again = subprocess.run(
        [sys.executable, "-m", "yoco.cli", "ledger", "ingest", str(data)],
        env={**os.environ, **yoco_env}, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{LINES} appended" in again.stdout
    assert _entries(db_url) == before + LINES
