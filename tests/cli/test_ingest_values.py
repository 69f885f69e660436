"""Never a traceback for a value that passed validation.

Before: NUL in a field, an offset of ±16:00…±23:59, a timestamp in year 9999, gpu or
gpus ≥ 2**31 passed validation and then broke in PostgreSQL: `yoco ledger ingest`
printed a traceback and exited 1. Validation now matches what the database stores, and
records dated more than 24 h after the clock are refused: exit 2, line and field named,
nothing written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from tests import factories as f
from yoco.cli import build_app

app = build_app()
runner = CliRunner()


def _failure(**over: Any) -> dict[str, Any]:
    rec = f.failure(cid="C-1", at=f.T0, node="n1", gpu=3, step=7, detail="x")
    rec.update(over)
    return rec


def _journal(db_url: str) -> int:
    eng = create_engine(db_url)
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())
    finally:
        eng.dispose()


@pytest.fixture
def contract(yoco_env: dict[str, str], tmp_path: Path) -> Path:
    p = tmp_path / "contracts.json"
    p.write_text(json.dumps([f.contract("C-1", start_date="2026-01-01")]))
    assert runner.invoke(app, ["contracts", "import", str(p)]).exit_code == 0
    return tmp_path


def _ingest(tmp: Path, records: list[Any]) -> Any:
    path = tmp / "batch.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return runner.invoke(app, ["ledger", "ingest", str(path)])


FUTURE = (datetime.now(UTC) + timedelta(hours=25)).isoformat()
SOON = (datetime.now(UTC) + timedelta(hours=23)).isoformat()

REFUSED = [
    ({"detail": "a\x00b"}, "detail", "NUL"),
    ({"node": "n\x00"}, "node", "control"),
    ({"job_id": "j\x00"}, "job_id", "control"),
    ({"occurred_at": "2026-03-02T12:00:00+16:00"}, "occurred_at", "UTC offset"),
    ({"occurred_at": "2026-03-02T12:00:00-23:59"}, "occurred_at", "UTC offset"),
    ({"occurred_at": "2026-03-02T12:00:00+14:01"}, "occurred_at", "UTC offset"),
    ({"occurred_at": "9999-12-31T23:59:59Z"}, "occurred_at", "future"),
    ({"occurred_at": "9999-12-31T23:59:59-14:00"}, "occurred_at", "future"),
    ({"occurred_at": "0001-01-01T00:00:00+14:00"}, "occurred_at", "1970"),
    ({"occurred_at": "1969-12-31T23:59:59Z"}, "occurred_at", "1970"),
    ({"occurred_at": FUTURE}, "occurred_at", "24 h"),
    ({"gpu": 2**31}, "gpu", "at most 2147483647"),
    ({"gpu": 2**53 - 1}, "gpu", "at most"),
]


@pytest.mark.parametrize("change, field, words", REFUSED)
def test_values_the_database_cannot_store_are_refused(contract, db_url, change, field, words):
    before = _journal(db_url)
    out = _ingest(contract, [f.job_started(cid="C-1", gpus=8), _failure(**change)])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    assert "line 2" in out.output and f"field '{field}'" in out.output, out.output
    assert words in out.output, out.output
    assert _journal(db_url) == before


@pytest.mark.parametrize(
    "rec",
    [
        f.job_started(cid="C-1", gpus=2**31),
        f.outcome(f.failure()["event_id"], cid="C-1", gpus_affected=2**31),
        f.outcome(f.failure()["event_id"], cid="C-1", step_seconds=1e12),
    ],
)
def test_int4_and_seconds_bounds(contract, db_url, rec):
    out = _ingest(contract, [rec])
    assert out.exit_code == 2 and "at most" in out.output and "line 1" in out.output, out.output
    assert _journal(db_url) == 0 + 1  # the contract entry only


def test_the_bounds_themselves_are_stored(contract, db_url):
    fail = _failure(gpu=2**31 - 1, occurred_at="2026-03-02T12:00:00+14:00")
    out = _ingest(
        contract,
        [
            f.job_started(cid="C-1", gpus=2**31 - 1, at=f.T0 - timedelta(days=1)),
            fail,
            f.outcome(fail["event_id"], cid="C-1", gpus_affected=2**31 - 1, at=f.later(5),
                      step_seconds=10**9),
            f.rec("job_progress", cid="C-1", job_id="j1", step=2**53 - 1, step_seconds=1.5,
                  at=f.later(6)),
            f.rec("job_progress", cid="C-1", job_id="j1", step=1, step_seconds=1.5,
                  occurred_at=SOON),
            f.rec("job_progress", cid="C-1", job_id="j1", step=2, step_seconds=1.5,
                  occurred_at="1970-01-01T00:00:00Z"),
            f.rec("job_progress", cid="C-1", job_id="j1", step=3, step_seconds=1.5,
                  occurred_at="2026-03-02T12:00:00-12:00"),
        ],
    )
    assert out.exit_code == 0, out.output
    assert "7 appended" in out.output
    sla = runner.invoke(app, ["sla", "C-1", "--year", "1", "--json"])
    assert sla.exit_code == 0, sla.output


_NASTY_TEXT = st.text(
    alphabet=st.sampled_from(["a", "\x00", "\n", "\u0085", "\ud800", "é", "\U0001f600", " "]),
    max_size=6,
)
_NASTY_INT = st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**53 - 1, 2**53, 2**63])
_NASTY_TIME = st.sampled_from(
    [
        "2026-03-02T12:00:00Z",
        "2026-03-02T12:00:00+16:00",
        "2026-03-02T12:00:00-23:59",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00+01:00",
        "2026-02-29T00:00:00Z",
        FUTURE,
    ]
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "detail": _NASTY_TEXT,
            "node": _NASTY_TEXT,
            "job_id": _NASTY_TEXT,
            "gpu": _NASTY_INT,
            "step": _NASTY_INT,
            "occurred_at": _NASTY_TIME,
        },
    )
)
def test_ingest_answers_0_or_2_never_a_traceback(contract, db_url, change):
    before = _journal(db_url)
    out = _ingest(contract, [_failure(**change)])
    assert out.exit_code in (0, 2), out.output
    assert "Traceback" not in out.output
    if out.exit_code == 2:
        assert "line 1" in out.output
        assert _journal(db_url) == before
