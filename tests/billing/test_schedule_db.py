"""Closing ended years without anyone asking: the scheduler's run, from several places at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from billing.schedule import CLOSE_DUE_LOCK, close_due_run, year_phase
from tests.billing.conftest import AFTER_Y1, add_contract, counts, failures, ingest_records
from yoco.database import unit_of_work

YOCO = [sys.executable, "-m", "yoco.cli"]


@pytest.fixture
def missed(engine) -> None:
    """C-1 (from 2025-01-01, two years) missed year 1: 8 of 9 resolved."""
    add_contract(engine, "C-1")
    recs, _ = failures("C-1", resolved=8, unresolved=1)
    ingest_records(engine, recs)


def _credits(engine) -> list[tuple[str, int, str]]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT contract_id, year, credit_note FROM billing_credits ORDER BY 1, 2"))]


def test_a_run_closes_due_years_once_and_is_idempotent(engine, signer, missed) -> None:
    with unit_of_work(engine) as s:
        run = close_due_run(s, now=AFTER_Y1, signer=signer)
    assert run.ran and run.credits_issued == 1
    assert [(r.contract_id, r.year, r.action) for r in run.results] == [("C-1", 1, "closed")]
    before = counts(engine, "billing_credits")
    with unit_of_work(engine) as s:
        again = close_due_run(s, now=AFTER_Y1, signer=signer)
    assert again.ran and again.results == []
    assert counts(engine, "billing_credits") == before
    assert _credits(engine) == [("C-1", 1, "CN-C-1-Y1")]


def test_a_run_that_finds_another_at_work_does_nothing(engine, signer, missed) -> None:
    before = counts(engine, "billing_credits", "billing_years")
    with engine.connect() as holder:
        holder.execute(text("BEGIN"))
        holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CLOSE_DUE_LOCK})
        with unit_of_work(engine) as s:
            run = close_due_run(s, now=AFTER_Y1, signer=signer)
        assert not run.ran and run.results == []
        holder.execute(text("ROLLBACK"))
    assert counts(engine, "billing_credits", "billing_years") == before
    with unit_of_work(engine) as s:  # the lock is gone with the holder's transaction
        assert close_due_run(s, now=AFTER_Y1, signer=signer).ran


def test_year_phase_open_closing_closed(engine, signer, missed) -> None:
    with unit_of_work(engine) as s:
        during = year_phase(s, "C-1", 1, now=datetime(2025, 6, 1, tzinfo=UTC))
        waiting = year_phase(s, "C-1", 1, now=AFTER_Y1)
    assert (during.state, during.label) == ("open", "open")
    assert "closed automatically by 2026-01-01 01:00 UTC" in during.credit_note
    assert (waiting.state, waiting.label) == ("closing", "ended, closing")
    assert "without any claim" in waiting.credit_note
    with unit_of_work(engine) as s:
        close_due_run(s, now=AFTER_Y1, signer=signer)
    with unit_of_work(engine) as s:
        done = year_phase(s, "C-1", 1, now=AFTER_Y1)
    assert (done.state, done.label) == ("closed", "closed")
    assert "guarantee was missed and the credit was issued" in done.credit_note


def test_year_phase_refuses_a_naive_now(engine, missed) -> None:
    with unit_of_work(engine) as s, pytest.raises(ValueError, match="now"):
        year_phase(s, "C-1", 1, now=datetime(2026, 1, 1))


@pytest.mark.slow
@pytest.mark.parametrize("wait", [False, True], ids=["skip-when-busy", "wait"])
def test_concurrent_close_due_processes_issue_one_credit(
    yoco_env, engine, missed, wait
) -> None:
    # Cron on two hosts and a CronJob at the same minute: real processes, one database.
    add_contract(engine, "C-2", start_date="2025-03-01")
    env = {**os.environ, **yoco_env}
    args = [*YOCO, "billing", "close-due", "--json", "--now", "2027-02-01T00:00:00+00:00"]
    procs = [
        subprocess.Popen(args + (["--wait"] if wait else []), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    acted = [(r["contract_id"], r["year"], r["action"])
             for stdout, _ in outs for r in json.loads(stdout)]
    assert sorted(acted) == [("C-1", 1, "closed"), ("C-1", 2, "closed"), ("C-2", 1, "closed")]
    assert _credits(engine) == [("C-1", 1, "CN-C-1-Y1")]
    with engine.connect() as c:
        kinds = dict(c.execute(text(
            "SELECT kind, count(*) FROM journal_entries WHERE kind IN ('year_close', 'credit') "
            "GROUP BY kind")).all())
    assert kinds == {"year_close": 3, "credit": 1}


@pytest.mark.slow
def test_yoco_serve_closes_ended_years_in_the_background(yoco_env, engine, missed) -> None:
    # Nobody runs close-due: the portal's own scheduler closes the ended year and issues
    # its credit shortly after start-up.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve = subprocess.Popen(
        [*YOCO, "serve", "--port", str(port), "--close-due-every", "0.05"],
        env={**os.environ, **yoco_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _credits(engine):
            assert serve.poll() is None, serve.communicate()
            time.sleep(0.3)
        assert _credits(engine) == [("C-1", 1, "CN-C-1-Y1")]
        # Further runs change nothing: one more run of the same code, queued behind the
        # scheduler's own on the close-due lock (--wait), finds nothing left to do...
        again = subprocess.run([*YOCO, "billing", "close-due", "--json", "--wait"],
                               env={**os.environ, **yoco_env}, capture_output=True,
                               text=True, timeout=120)
        assert again.returncode == 0 and json.loads(again.stdout) == [], again
    finally:
        serve.terminate()
        _, stderr = serve.communicate(timeout=60)
    assert serve.returncode == 0, stderr
    # ...and whatever the scheduler ran meanwhile, up to its stop, added nothing either.
    assert _credits(engine) == [("C-1", 1, "CN-C-1-Y1")]
    with engine.connect() as c:
        assert c.execute(text(
            "SELECT count(*) FROM journal_entries WHERE kind = 'year_close'")).scalar_one() == 1
    assert "closing ended contract years every 0.05 min" in stderr
    assert "C-1 year 1 closed (guarantee missed); credit CN-C-1-Y1" in stderr
