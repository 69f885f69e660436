"""The order of lines in a batch does not matter, on a real PostgreSQL.

Before: an outcome whose failure stood later in the same file, or a job_finished whose
job_started did, was refused (a 1,294-record file exported unordered: 306 errors).
Now a batch is appended in causal order (``ledger.records.causal_order``): references
resolve wherever they stand; independent records keep their file order.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from billing.projections import PROJECTORS
from billing.services import sla_figures
from ledger.contracts import add_contracts
from ledger.ingest import ingest
from ledger.records import causal_order, order_key, parse_contracts, parse_jsonl
from tests import factories as f
from yoco.cli import build_app
from yoco.database import unit_of_work

T0 = datetime(2026, 2, 1, tzinfo=UTC)
NOW = datetime(2026, 11, 1, tzinfo=UTC)
runner = CliRunner()
app = build_app()


def _keys(records: list[dict[str, Any]]) -> list[Any]:
    recs, errors = parse_jsonl(f.jsonl(records))
    assert not errors, errors
    return [order_key(r) for r in recs]


def _kinds(records: list[dict[str, Any]], order: list[int]) -> list[str]:
    return [records[i]["kind"] for i in order]


# --------------------------------------------------------------------- the order itself


def test_an_outcome_and_an_exclusion_before_their_failure_follow_it() -> None:
    fail = f.failure(cid="C-1", at=T0)
    batch = [
        f.outcome(fail["event_id"], cid="C-1", at=T0 + timedelta(minutes=1)),
        f.rec("exclusion", cid="C-1", at=T0, failure_event_id=fail["event_id"],
              reason="r", approved_by="ops"),
        f.job_started(cid="C-1", at=T0 - timedelta(hours=1)),
        fail,
    ]
    order, errors = causal_order(_keys(batch))
    assert errors == []
    # The start keeps its place relative to the failure (it comes first anyway: the
    # failure follows its job's start); outcome and exclusion keep their file order.
    assert _kinds(batch, order) == ["job_started", "failure", "outcome", "exclusion"]


def test_independent_records_keep_their_file_order() -> None:
    batch = [f.rec("job_progress", cid="C-1", at=T0 + timedelta(minutes=m), job_id=f"j{m}",
                   step=m, step_seconds=1.0) for m in (5, 1, 4, 2, 3)]
    order, errors = causal_order(_keys(batch))
    assert errors == [] and order == [0, 1, 2, 3, 4]


def test_a_job_that_finishes_and_starts_again_in_one_shuffled_batch() -> None:
    s1 = f.job_started(cid="C-1", at=T0)
    e1 = f.rec("job_finished", cid="C-1", at=T0 + timedelta(hours=1), job_id="j1", step=10)
    s2 = f.job_started(cid="C-1", at=T0 + timedelta(hours=2))
    fail2 = f.failure(cid="C-1", at=T0 + timedelta(hours=2, minutes=5))
    e2 = f.rec("job_finished", cid="C-1", at=T0 + timedelta(hours=3), job_id="j1", step=20)
    batch = [e2, fail2, s2, e1, s1]
    order, errors = causal_order(_keys(batch))
    assert errors == []
    # Starts and finishes in time order; the failure after its start. e2 and fail2 do
    # not depend on each other, so they keep their file order (e2 first).
    assert [batch[i]["event_id"] for i in order] == [
        r["event_id"] for r in (s1, e1, s2, e2, fail2)
    ]


def test_a_reference_to_a_record_that_is_no_failure_is_refused() -> None:
    job = f.job_started(cid="C-1", at=T0)
    out = f.outcome(job["event_id"], cid="C-1", at=T0)
    _order, errors = causal_order(_keys([out, job]))
    [err] = errors
    assert (err.line, err.field) == (1, "failure_event_id")
    assert "is a job_started record, not a failure" in err.message
    # An outcome naming itself is the same mistake, not a cycle.
    me = f.outcome(str(uuid.uuid4()), cid="C-1", at=T0)
    me["failure_event_id"] = me["event_id"]
    _, errors = causal_order(_keys([me]))
    assert [e.field for e in errors] == ["failure_event_id"]


# --------------------------------------------------------------------- through the CLI


@pytest.fixture
def contract(yoco_env: dict[str, str], tmp_path: Path) -> Path:
    p = tmp_path / "contracts.json"
    p.write_text(json.dumps([f.contract("C-1", start_date="2026-01-01")]))
    assert runner.invoke(app, ["contracts", "import", str(p)]).exit_code == 0
    return tmp_path


def _ingest(tmp: Path, records: list[dict[str, Any]]) -> Any:
    path = tmp / "batch.jsonl"
    path.write_bytes(f.jsonl(records))
    return runner.invoke(app, ["ledger", "ingest", str(path)])


def test_an_unordered_file_is_ingested_and_counted(contract, engine) -> None:
    fail = f.failure(cid="C-1", at=T0 + timedelta(minutes=10))
    batch = [
        f.outcome(fail["event_id"], cid="C-1", at=T0 + timedelta(minutes=11)),
        f.rec("job_finished", cid="C-1", at=T0 + timedelta(hours=5), job_id="j1", step=99),
        fail,
        f.rec("job_progress", cid="C-1", at=T0 + timedelta(minutes=5), job_id="j1", step=5,
              step_seconds=1.0),
        f.job_started(cid="C-1", at=T0),
    ]
    out = _ingest(contract, batch)
    assert out.exit_code == 0, out.output
    assert "5 appended" in out.output
    with engine.connect() as c:
        kinds = c.execute(
            text("SELECT kind FROM journal_entries WHERE log_id = 'C-1' ORDER BY seq")
        ).scalars().all()
        span = c.execute(text("SELECT finished_at IS NOT NULL FROM job_spans")).scalar_one()
        outcome = c.execute(text("SELECT outcome FROM outcomes")).scalar_one()
    # The start first; then, in file order, whatever is ready: the finish (line 2), the
    # failure (line 3), its outcome (line 1, ready once its failure is in), the progress.
    assert kinds == ["contract", "job_started", "job_finished", "failure", "outcome",
                     "job_progress"]
    assert span and outcome == "live_migrated"
    # The same file again: every record is already there.
    again = _ingest(contract, list(reversed(batch)))
    assert again.exit_code == 0 and "0 appended" in again.output


def test_a_reference_found_neither_in_the_batch_nor_in_the_ledger_is_refused(
    contract, engine
) -> None:
    fail = f.failure(cid="C-1", at=T0)
    batch = [
        f.outcome(str(uuid.uuid4()), cid="C-1", at=T0),
        fail,
        f.job_started(cid="C-1", at=T0 - timedelta(minutes=1)),
    ]
    out = _ingest(contract, batch)
    assert out.exit_code == 2, out.output
    assert "line 1" in out.output and "failure_event_id" in out.output
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one() == 1


# --------------------------------------------------------------------- any permutation


def _story(rng: random.Random, cid: str) -> list[dict[str, Any]]:
    """A valid batch in time order: jobs that start, progress, fail, recover, finish."""
    out: list[dict[str, Any]] = []
    for j in range(rng.randint(1, 3)):
        t = T0 + timedelta(days=j, minutes=rng.randint(0, 50))
        for span in range(rng.randint(1, 2)):
            out.append(f.rec("job_started", cid, t, job_id=f"j{j}", gpus=rng.choice([8, 64])))
            for _ in range(rng.randint(0, 3)):
                t += timedelta(minutes=rng.randint(1, 30))
                fail = f.rec("failure", cid, t, job_id=f"j{j}",
                             failure_class=rng.choice(["unplanned", "preemptive", "planned"]),
                             cause=rng.choice(["gpu_lost", "thermal", "facility_power"]))
                out.append(fail)
                for _ in range(rng.randint(0, 2)):
                    t += timedelta(minutes=1)
                    result = rng.choice(["live_migrated", "rolled_back", "failed"])
                    out.append(f.rec(
                        "outcome", cid, t, failure_event_id=fail["event_id"], outcome=result,
                        lost_steps=0 if result == "live_migrated" else rng.randint(0, 50),
                        recovery_seconds=rng.choice([0.5, 2, 30]), step_seconds=1.5,
                        gpus_affected=8))
                if rng.random() < 0.2:
                    t += timedelta(minutes=1)
                    out.append(f.rec("exclusion", cid, t, failure_event_id=fail["event_id"],
                                     reason="customer window", approved_by="ops"))
            t += timedelta(minutes=5)
            out.append(f.rec("job_progress", cid, t, job_id=f"j{j}", step=100 * (span + 1),
                             step_seconds=1.5))
            if span == 0 or rng.random() < 0.7:
                t += timedelta(hours=rng.randint(1, 9))
                out.append(f.rec("job_finished", cid, t, job_id=f"j{j}", step=1000))
                t += timedelta(minutes=rng.randint(1, 9))
    return out


def _retarget(records: list[dict[str, Any]], cid: str) -> list[dict[str, Any]]:
    """The same story for contract ``cid`` with fresh event ids."""
    fresh = {r["event_id"]: str(uuid.uuid4()) for r in records}
    out = []
    for r in records:
        r = dict(r, contract_id=cid, event_id=fresh[r["event_id"]])
        if "failure_event_id" in r:
            r["failure_event_id"] = fresh[r["failure_event_id"]]
        out.append(r)
    return out


def _figures(session: Session, cid: str) -> dict[str, Any]:
    data = sla_figures(session, cid, year=1, now=NOW).to_json()
    for key in ("contract_id",):
        data.pop(key, None)
    return data


def _projection(session: Session, cid: str) -> list[Any]:
    rows = session.execute(
        text(
            "SELECT f.job_id, f.failure_class, f.cause, f.occurred_at, o.outcome, o.lost_steps,"
            " o.occurred_at, (SELECT count(*) FROM exclusions e"
            "  WHERE e.failure_event_id = f.event_id)"
            " FROM failures f LEFT JOIN outcomes o ON o.failure_event_id = f.event_id"
            " WHERE f.contract_id = :c ORDER BY 1, 4, 7"
        ),
        {"c": cid},
    ).all()
    spans = session.execute(
        text("SELECT job_id, gpus, started_at, finished_at FROM job_spans"
             " WHERE contract_id = :c ORDER BY 1, 3"),
        {"c": cid},
    ).all()
    return [tuple(r) for r in rows] + [tuple(r) for r in spans]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), shuffle=st.randoms(use_true_random=False))
def test_any_permutation_of_a_valid_batch_gives_the_same_figures(engine, seed, shuffle) -> None:
    story = _story(random.Random(seed), "X")
    n = uuid.uuid4().hex[:8]
    ordered, permuted = f"O-{n}", f"P-{n}"
    specs, errors = parse_contracts(
        f.jsonl([f.contract(c, start_date="2026-01-01", customer="Acme") for c in (ordered, permuted)])
    )
    assert not errors
    mixed = _retarget(story, permuted)
    shuffle.shuffle(mixed)
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    for _cid, batch in ((ordered, _retarget(story, ordered)), (permuted, mixed)):
        recs, errors = parse_jsonl(f.jsonl(batch))
        assert not errors, errors
        with unit_of_work(engine) as s:
            ingest(s, recs, extra_projectors=PROJECTORS)
    with Session(engine) as s:
        assert _projection(s, ordered) == _projection(s, permuted)
        assert _figures(s, ordered) == _figures(s, permuted)


def test_a_big_shuffled_batch_is_accepted(engine) -> None:
    rng = random.Random(7)
    story: list[dict[str, Any]] = []
    for k in range(60):
        part = _retarget(_story(rng, "X"), "C-BIG")
        for r in part:
            if "job_id" in r:
                r["job_id"] = f"{r['job_id']}-{k}"
        story += part
    specs, _ = parse_contracts(f.jsonl([f.contract("C-BIG", start_date="2026-01-01")]))
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    rng.shuffle(story)
    recs, errors = parse_jsonl(f.jsonl(story))
    assert not errors
    with unit_of_work(engine) as s:
        result = ingest(s, recs, extra_projectors=PROJECTORS)
    assert result.appended == len(story)
