"""The records a lender of spare borrowing writes (runtime.borrowing's own builders) go
through the real ledger (PostgreSQL, billing's projections) and come out of billing as a
failure *with* its outcome: never pending; not covered under default terms (``planned``);
resolved where a contract covers planned failures; lost GPU-seconds = the GPUs lent x
the time at reduced width."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from billing.services import figures_for
from billing.terms import Terms
from ledger.contracts import get_contract
from runtime import records as R
from runtime.borrowing import CAUSE_LENT, lent_detail, loan_outcome
from tests.billing.conftest import add_contract, ingest_records

START = datetime(2025, 1, 1, tzinfo=UTC)
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _lender_records() -> list[dict[str, object]]:
    at = lambda s: (T0 + timedelta(seconds=s)).isoformat()  # noqa: E731
    fail = R.failure(contract_id="C-1", job_id="lo", failure_class="planned", cause=CAUSE_LENT,
                     node="lo1", step=9, occurred_at=at(5),
                     detail=lent_detail(host="lo1", borrower="hi", borrower_priority=10,
                                        priority=1, width=2, narrower=1))
    return [
        R.job_started(contract_id="C-1", job_id="lo", gpus=2, occurred_at=at(0)),
        fail,
        R.job_progress(contract_id="C-1", job_id="lo", step=20, step_seconds=0.4,
                       occurred_at=at(10)),
        loan_outcome(contract_id="C-1", failure_event_id=str(fail["event_id"]),
                     seconds=7.5, step_seconds=0.4, gpus=1, occurred_at=at(12.5)),
        R.job_finished(contract_id="C-1", job_id="lo", step=60, occurred_at=at(30)),
    ]


def test_a_loan_is_a_planned_failure_with_its_outcome_in_the_ledger_and_billing(
        engine: Engine) -> None:
    add_contract(engine)
    ingest_records(engine, _lender_records())
    end, now = START + timedelta(days=365), START + timedelta(days=400)
    with Session(engine) as s:
        contract = get_contract(s, "C-1")
        default = figures_for(s, contract, START, end, now, Terms())
        planned = figures_for(s, contract, START, end, now,
                              Terms(covered_classes=frozenset({"unplanned", "planned"})))
    assert (default.total_failures, default.not_covered_failures, default.covered_failures,
            default.pending_failures) == (1, 1, 0, 0)
    assert (planned.covered_failures, planned.resolved_failures,
            planned.pending_failures) == (1, 1, 0)
    for fig in (default, planned):
        assert fig.lost_gpu_seconds == Decimal("7.5")  # 1 GPU lent x 7.5 s narrower
        assert fig.lost_by_class()["planned"] == Decimal("7.5")
