"""SLA figures and terms, as pure functions over plain records; no database."""

from __future__ import annotations

import itertools
import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing.sla import (
    Coverage,
    Exclusion,
    Failure,
    FailureStatus,
    JobSpan,
    Outcome,
    allocated_gpu_seconds,
    classify,
    compute_figures,
    decimal_string,
    failure_rows,
    is_resolved,
    latest_outcomes,
    lost_gpu_seconds,
)
from billing.terms import Terms
from billing.years import contract_year_bounds

D = Decimal
T0 = datetime(2026, 1, 1, tzinfo=UTC)
YEAR = (T0, datetime(2027, 1, 1, tzinfo=UTC))
_seq = itertools.count(1)


def at(days: float = 0, **kw: float) -> datetime:
    return T0 + timedelta(days=days, **kw)


def failure(
    eid: str,
    when: datetime | None = None,
    cls: str = "unplanned",
    cause: str = "gpu_lost",
    job: str = "job-1",
) -> Failure:
    return Failure(
        event_id=eid,
        seq=next(_seq),
        occurred_at=when or at(10),
        failure_class=cls,
        cause=cause,
        job_id=job,
    )


def outcome(
    fid: str,
    kind: str = "live_migrated",
    when: datetime | None = None,
    *,
    lost_steps: int = 0,
    recovery: str = "0",
    step: str = "1",
    gpus: int = 8,
    seq: int | None = None,
    eid: str | None = None,
) -> Outcome:
    s = next(_seq) if seq is None else seq
    return Outcome(
        event_id=eid or f"o-{fid}-{s}",
        failure_event_id=fid,
        seq=s,
        occurred_at=when or at(10, minutes=5),
        outcome=kind,
        lost_steps=lost_steps,
        recovery_seconds=D(recovery),
        step_seconds=D(step),
        gpus_affected=gpus,
    )


def exclusion(fid: str, reason: str = "customer maintenance window") -> Exclusion:
    return Exclusion(
        event_id=f"x-{fid}", failure_event_id=fid, seq=next(_seq), occurred_at=at(20), reason=reason
    )


def figures(
    failures: list[Failure],
    outcomes: list[Outcome] = (),  # type: ignore[assignment]
    exclusions: list[Exclusion] = (),  # type: ignore[assignment]
    jobs: list[JobSpan] = (),  # type: ignore[assignment]
    *,
    terms: Terms | None = None,
    period: tuple[datetime, datetime] = YEAR,
    now: datetime | None = None,
) -> Any:
    return compute_figures(
        terms=terms or Terms(),
        period_start=period[0],
        period_end=period[1],
        now=now or datetime(2030, 1, 1, tzinfo=UTC),
        failures=failures,
        outcomes=outcomes,
        exclusions=exclusions,
        jobs=jobs,
    )


def resolved_set(n_resolved: int, n_rolled_back: int) -> tuple[list[Failure], list[Outcome]]:
    fs, os_ = [], []
    for i in range(n_resolved + n_rolled_back):
        f = failure(f"f{i}", at(0, minutes=i + 1))
        fs.append(f)
        if i < n_resolved:
            os_.append(outcome(f.event_id))
        else:
            os_.append(outcome(f.event_id, "rolled_back", lost_steps=10))
    return fs, os_


# ------------------------------------------------------------------ terms


def test_terms_defaults() -> None:
    t = Terms()
    assert t.threshold_percent == D(90)
    assert t.credit_percent == D(25)
    assert t.covered_classes == frozenset({"unplanned", "preemptive"})
    assert t.excluded_causes == frozenset(
        {"network_wide_outage", "facility_power", "customer_code"}
    )


def test_terms_json_round_trip() -> None:
    t = Terms.from_json(
        {
            "threshold_percent": "92.5",
            "credit_percent": 10,
            "covered_classes": ["planned", "unplanned"],
            "excluded_causes": [],
        }
    )
    assert t.threshold_percent == D("92.5")
    assert t.credit_percent == D(10)
    assert t.covered_classes == frozenset({"planned", "unplanned"})
    assert t.excluded_causes == frozenset()
    assert Terms.from_json(t.to_json()) == t
    assert Terms.from_json(None) == Terms()
    assert Terms.from_json({}) == Terms()
    assert Terms().to_json() == {
        "threshold_percent": "90",
        "credit_percent": "25",
        "covered_classes": ["preemptive", "unplanned"],
        "excluded_causes": ["customer_code", "facility_power", "network_wide_outage"],
    }
    json.dumps(Terms().to_json())


@pytest.mark.parametrize(
    "obj",
    [
        {"threshold_percent": 0},
        {"threshold_percent": "100.01"},
        {"threshold_percent": -5},
        {"threshold_percent": 90.0},  # floats are refused
        {"threshold_percent": True},
        {"threshold_percent": "ninety"},
        {"threshold_percent": "NaN"},
        {"credit_percent": 0},
        {"credit_percent": 101},
        {"covered_classes": ["unplanned", "cosmic_rays"]},
        {"covered_classes": "unplanned"},
        {"excluded_causes": [1]},
        {"surprise": 1},
    ],
)
def test_terms_refuse_bad_json(obj: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="terms"):
        Terms.from_json(obj)


def test_terms_accept_100_percent_and_refuse_bad_constructor_values() -> None:
    assert Terms(threshold_percent=D(100)).threshold_percent == 100
    with pytest.raises(ValueError):
        Terms(threshold_percent=D(0))
    with pytest.raises(ValueError):
        Terms(covered_classes=frozenset({"sometimes"}))


# ------------------------------------------------------------------ records


def test_records_refuse_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="naive"):
        Failure(
            event_id="f",
            seq=1,
            occurred_at=datetime(2026, 1, 1),
            failure_class="unplanned",
            cause="gpu_lost",
            job_id="j",
        )
    with pytest.raises(ValueError, match="naive"):
        JobSpan(job_id="j", gpus=8, started_at=datetime(2026, 1, 1), finished_at=None)
    with pytest.raises(ValueError, match="naive"):
        outcome("f", when=datetime(2026, 1, 1))


def test_records_refuse_bad_values() -> None:
    with pytest.raises(ValueError):
        failure("f", cls="meteor")
    with pytest.raises(ValueError):
        outcome("f", "teleported")
    with pytest.raises(ValueError):
        outcome("f", "live_migrated", lost_steps=3)  # refused by DESIGN section 4
    with pytest.raises(ValueError):
        outcome("f", "rolled_back", lost_steps=-1)
    with pytest.raises(ValueError):
        outcome("f", "rolled_back", step="0")
    with pytest.raises(ValueError):
        outcome("f", "rolled_back", recovery="-1")
    with pytest.raises(ValueError):
        outcome("f", "rolled_back", gpus=0)
    with pytest.raises(ValueError):
        Outcome(
            event_id="o",
            failure_event_id="f",
            seq=1,
            occurred_at=T0,
            outcome="failed",
            lost_steps=0,
            recovery_seconds=1.5,  # type: ignore[arg-type]
            step_seconds=D(1),
            gpus_affected=1,
        )
    with pytest.raises(ValueError):
        JobSpan(job_id="j", gpus=8, started_at=at(2), finished_at=at(1))


# ------------------------------------------------------------------ building blocks


def test_lost_gpu_seconds() -> None:
    o = outcome("f", "rolled_back", lost_steps=120, recovery="30.5", step="0.25", gpus=1024)
    assert lost_gpu_seconds(o) == 1024 * (D("30.5") + 120 * D("0.25"))
    assert lost_gpu_seconds(outcome("f", recovery="2.75", gpus=8)) == D(22)
    assert lost_gpu_seconds(None) == 0


def test_latest_outcome_by_time_then_seq() -> None:
    early = outcome("f", "rolled_back", at(1), lost_steps=5, seq=50)
    late = outcome("f", "live_migrated", at(2), seq=10)  # later in time, lower seq
    assert latest_outcomes([late, early])["f"] is late
    tie_low = outcome("f", "live_migrated", at(3), seq=60)
    tie_high = outcome("f", "failed", at(3), seq=61)
    for order in itertools.permutations([early, late, tie_low, tie_high]):
        assert latest_outcomes(order)["f"] is tie_high


def test_is_resolved() -> None:
    assert is_resolved(outcome("f"))
    assert not is_resolved(outcome("f", "rolled_back", lost_steps=0))
    assert not is_resolved(outcome("f", "failed"))
    assert not is_resolved(None)


def test_classify() -> None:
    t = Terms()
    assert classify(failure("a"), t, set()) is Coverage.COVERED
    assert classify(failure("b", cls="preemptive", cause="ecc_rising"), t, set()) is (
        Coverage.COVERED
    )
    assert classify(failure("c", cls="planned", cause="maintenance"), t, set()) is (
        Coverage.NOT_COVERED
    )
    assert classify(failure("d", cause="facility_power"), t, set()) is Coverage.EXCLUDED
    assert classify(failure("e"), t, {"e"}) is Coverage.EXCLUDED
    # Class is checked first: an uncovered class stays not covered even if excluded.
    assert classify(failure("g", cls="planned", cause="customer_code"), t, {"g"}) is (
        Coverage.NOT_COVERED
    )
    # Planned failures count when the terms cover them.
    t2 = Terms(covered_classes=frozenset({"planned"}))
    assert classify(failure("h", cls="planned", cause="maintenance"), t2, set()) is (
        Coverage.COVERED
    )
    assert classify(failure("i"), t2, set()) is Coverage.NOT_COVERED


def test_allocated_running_and_finished_jobs() -> None:
    jobs = [
        JobSpan(job_id="a", gpus=8, started_at=at(0), finished_at=at(0, hours=2)),
        JobSpan(job_id="b", gpus=4, started_at=at(1), finished_at=None),
    ]
    now = at(1, hours=3)
    assert allocated_gpu_seconds(jobs, *YEAR, now) == 8 * 7200 + 4 * 3 * 3600
    # A running job stops at the period end when now is later.
    period = (at(1), at(1, hours=1))
    assert allocated_gpu_seconds(jobs, *period, at(300)) == 4 * 3600


def test_allocated_job_spanning_a_year_boundary() -> None:
    start = date(2026, 1, 1)
    y1 = contract_year_bounds(start, "America/New_York", 1)
    y2 = contract_year_bounds(start, "America/New_York", 2)
    job = JobSpan(
        job_id="long",
        gpus=16,
        started_at=y1[1] - timedelta(hours=10),
        finished_at=y1[1] + timedelta(hours=5),
    )
    now = y2[1]
    assert allocated_gpu_seconds([job], *y1, now) == 16 * 10 * 3600
    assert allocated_gpu_seconds([job], *y2, now) == 16 * 5 * 3600


def test_allocated_microseconds_and_empty() -> None:
    job = JobSpan(job_id="a", gpus=3, started_at=at(0), finished_at=at(0, microseconds=1))
    assert allocated_gpu_seconds([job], *YEAR, at(400)) == D("0.000003")
    assert allocated_gpu_seconds([], *YEAR, at(400)) == 0
    # Now before the period: nothing allocated yet.
    running = JobSpan(job_id="b", gpus=3, started_at=at(-10), finished_at=None)
    assert allocated_gpu_seconds([running], *YEAR, at(-1)) == 0


def test_allocated_refuses_bad_period() -> None:
    with pytest.raises(ValueError):
        allocated_gpu_seconds([], YEAR[1], YEAR[0], YEAR[1])
    with pytest.raises(ValueError, match="naive"):
        allocated_gpu_seconds([], YEAR[0], YEAR[1], datetime(2026, 6, 1))


# ------------------------------------------------------------------ guarantee


def test_exactly_ninety_percent_meets_the_guarantee() -> None:
    fs, os_ = resolved_set(9, 1)
    fig = figures(fs, os_)
    assert (fig.covered_failures, fig.resolved_failures) == (10, 9)
    assert fig.resolution_rate == D("0.9")
    assert fig.guarantee_met is True
    assert fig.to_json()["resolution_rate"] == "0.900000"


def test_eight_of_nine_misses_the_guarantee() -> None:
    fs, os_ = resolved_set(8, 1)
    fig = figures(fs, os_)
    assert (fig.covered_failures, fig.resolved_failures) == (9, 8)
    assert fig.guarantee_met is False  # 800 < 810
    assert fig.to_json()["resolution_rate"] == "0.888889"
    assert fig.rolled_back_failures == 1


def test_fractional_threshold_is_exact() -> None:
    fs, os_ = resolved_set(925, 75)  # 92.5% exactly
    assert figures(fs, os_).covered_failures == 1000
    assert figures(fs, os_, terms=Terms(threshold_percent=D("92.5"))).guarantee_met
    fs, os_ = resolved_set(924, 76)
    assert not figures(fs, os_, terms=Terms(threshold_percent=D("92.5"))).guarantee_met


def test_zero_covered_failures() -> None:
    fig = figures([failure("p", cls="planned", cause="maintenance")])
    assert fig.covered_failures == 0
    assert fig.resolution_rate is None
    assert fig.guarantee_met is True
    assert fig.to_json()["resolution_rate"] is None
    empty = figures([])
    assert empty.guarantee_met is True and empty.total_failures == 0


def test_pending_failures_are_unresolved() -> None:
    fs = [failure("a", at(1)), failure("b", at(2))]
    fig = figures(fs, [outcome("a")])
    assert fig.pending_failures == 1
    assert fig.resolved_failures == 1
    assert fig.unresolved_failures == 1
    assert fig.guarantee_met is False
    assert fig.lost_gpu_seconds == 0


def test_correction_rolled_back_then_live_migrated_is_resolved() -> None:
    f = failure("a", at(5))
    os_ = [
        outcome("a", "rolled_back", at(5, minutes=1), lost_steps=50, gpus=8),
        outcome("a", "live_migrated", at(6), recovery="4", gpus=8),
    ]
    fig = figures([f], os_)
    assert fig.resolved_failures == 1 and fig.rolled_back_failures == 0
    assert fig.lost_gpu_seconds == D(32)  # from the latest outcome only


def test_correction_live_migrated_then_rolled_back_is_unresolved() -> None:
    f = failure("a", at(5))
    os_ = [
        outcome("a", "live_migrated", at(5, minutes=1)),
        outcome("a", "rolled_back", at(6), lost_steps=50, recovery="10", step="2", gpus=8),
    ]
    fig = figures([f], os_)
    assert fig.resolved_failures == 0 and fig.rolled_back_failures == 1
    assert fig.lost_gpu_seconds == 8 * (10 + 50 * 2)


def test_same_time_outcomes_tie_broken_by_seq() -> None:
    f = failure("a", at(5))
    same = at(5, minutes=2)
    first = outcome("a", "failed", same, seq=1000)
    second = outcome("a", "live_migrated", same, seq=1001)
    assert figures([f], [second, first]).resolved_failures == 1
    first = outcome("a", "live_migrated", same, seq=2000)
    second = outcome("a", "failed", same, seq=2001)
    fig = figures([f], [second, first])
    assert fig.resolved_failures == 0 and fig.failed_failures == 1


def test_outcome_recorded_after_the_period_still_counts() -> None:
    f = failure("a", YEAR[1] - timedelta(seconds=1))
    o = outcome("a", when=YEAR[1] + timedelta(minutes=3))
    assert figures([f], [o]).resolved_failures == 1


def test_outcomes_of_other_failures_are_ignored() -> None:
    fig = figures([failure("a")], [outcome("a"), outcome("zzz", "failed", recovery="100")])
    assert fig.resolved_failures == 1
    assert fig.lost_gpu_seconds == 0


# ------------------------------------------------------------------ coverage and exclusions


def test_exclusion_entry_removes_a_failure() -> None:
    fs = [failure("a", at(1)), failure("b", at(2))]
    os_ = [outcome("a"), outcome("b", "failed", recovery="60", gpus=2)]
    fig = figures(fs, os_, [exclusion("b")])
    assert fig.covered_failures == 1
    assert fig.excluded_failures == 1
    assert fig.failed_failures == 0
    assert fig.guarantee_met is True
    # Excluded failures still cost machine time.
    assert fig.lost_gpu_seconds == 120


def test_excluded_causes_are_excluded() -> None:
    fs = [
        failure("a", cause="network_wide_outage"),
        failure("b", cause="facility_power"),
        failure("c", cls="preemptive", cause="customer_code"),
        failure("d", cause="gpu_lost"),
    ]
    fig = figures(fs, [outcome("d")])
    assert fig.excluded_failures == 3
    assert fig.covered_failures == 1
    assert fig.pending_failures == 0
    fig2 = figures(fs, [outcome("d")], terms=Terms(excluded_causes=frozenset()))
    assert fig2.covered_failures == 4 and fig2.pending_failures == 3


def test_planned_failures_are_not_covered_but_cost_time() -> None:
    fs = [failure("a"), failure("p", cls="planned", cause="maintenance")]
    os_ = [outcome("a"), outcome("p", "rolled_back", lost_steps=10, step="3", gpus=4)]
    fig = figures(fs, os_, [exclusion("p")])
    assert fig.not_covered_failures == 1
    assert fig.excluded_failures == 0  # an exclusion cannot remove what was never covered
    assert fig.covered_failures == 1
    assert fig.lost_gpu_seconds == 120
    assert fig.lost_by_class() == {"unplanned": 0, "preemptive": 0, "planned": 120}


def test_counts_partition_the_failures() -> None:
    fs = [
        failure("r", at(1)),
        failure("rb", at(2)),
        failure("fl", at(3)),
        failure("pd", at(4)),
        failure("xc", at(5), cause="facility_power"),
        failure("xe", at(6)),
        failure("nc", at(7), cls="planned", cause="maintenance"),
    ]
    os_ = [
        outcome("r"),
        outcome("rb", "rolled_back", lost_steps=2),
        outcome("fl", "failed"),
    ]
    fig = figures(fs, os_, [exclusion("xe")])
    assert fig.total_failures == 7
    assert (fig.covered_failures, fig.excluded_failures, fig.not_covered_failures) == (4, 2, 1)
    assert (
        fig.resolved_failures,
        fig.rolled_back_failures,
        fig.failed_failures,
        fig.pending_failures,
    ) == (1, 1, 1, 1)


def test_only_failures_of_the_period_count() -> None:
    fs = [
        failure("before", YEAR[0] - timedelta(microseconds=1)),
        failure("first", YEAR[0]),
        failure("last", YEAR[1] - timedelta(microseconds=1)),
        failure("after", YEAR[1]),
    ]
    os_ = [outcome(f.event_id, "failed", recovery="1", gpus=1) for f in fs]
    fig = figures(fs, os_)
    assert fig.total_failures == 2
    assert fig.failed_failures == 2
    assert fig.lost_gpu_seconds == 2


def test_failure_at_year_boundary_in_contract_zone() -> None:
    f = failure("edge", datetime.fromisoformat("2026-12-31T23:30:00-05:00"))
    o = outcome("edge", "failed")
    ny1 = contract_year_bounds(date(2026, 1, 1), "America/New_York", 1)
    utc2 = contract_year_bounds(date(2026, 1, 1), "UTC", 2)
    assert figures([f], [o], period=ny1).covered_failures == 1
    assert figures([f], [o], period=utc2).covered_failures == 1
    assert figures([f], [o], period=YEAR).covered_failures == 0  # UTC year 1


def test_duplicate_failure_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        figures([failure("a"), failure("a")])


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        figures([], now=datetime(2026, 6, 1))


# ------------------------------------------------------------------ goodput and JSON


def test_goodput_with_nothing_allocated_is_one() -> None:
    fig = figures([failure("a")], [outcome("a", "failed", recovery="100")])
    assert fig.allocated_gpu_seconds == 0
    assert fig.goodput == 1
    assert fig.to_json()["goodput"] == "1.000000"


def test_goodput_and_hours() -> None:
    job = JobSpan(job_id="job-1", gpus=8, started_at=at(0), finished_at=at(0, hours=10))
    fs = [failure("a", at(0, hours=1)), failure("b", at(0, hours=2), cls="planned")]
    os_ = [
        outcome("a", "rolled_back", lost_steps=100, recovery="60", step="1.5", gpus=8),
        outcome("b", recovery="30", gpus=8),
    ]
    fig = figures(fs, os_, jobs=[job])
    lost = 8 * (60 + 150) + 8 * 30
    assert fig.lost_gpu_seconds == lost == 1920
    assert fig.allocated_gpu_seconds == 8 * 36000
    assert fig.goodput == 1 - D(lost) / D(8 * 36000)
    j = fig.to_json()
    assert j["allocated_gpu_hours"] == "80.000000"
    assert j["lost_gpu_hours"] == "0.533333"
    assert j["goodput"] == "0.993333"  # 1 - 1920/288000 = 0.99333...
    assert j["lost_gpu_hours_by_class"] == {
        "unplanned": "0.466667",
        "preemptive": "0.000000",
        "planned": "0.066667",
    }


def test_goodput_is_not_clamped() -> None:
    job = JobSpan(job_id="job-1", gpus=1, started_at=at(0), finished_at=at(0, seconds=100))
    fig = figures(
        [failure("a", at(0))], [outcome("a", "failed", recovery="150", gpus=1)], jobs=[job]
    )
    assert fig.goodput == D("-0.5")
    assert fig.to_json()["goodput"] == "-0.500000"


def test_running_job_counts_to_now() -> None:
    job = JobSpan(job_id="job-1", gpus=2, started_at=at(0), finished_at=None)
    fig = figures([], jobs=[job], now=at(0, hours=5))
    assert fig.allocated_gpu_seconds == 2 * 5 * 3600
    assert fig.to_json()["allocated_gpu_hours"] == "10.000000"


def test_to_json_fields_and_types() -> None:
    fs, os_ = resolved_set(2, 1)
    j = figures(fs, os_).to_json()
    for key in (
        "period_start",
        "period_end",
        "covered_failures",
        "resolved_failures",
        "excluded_failures",
        "pending_failures",
        "resolution_rate",
        "guarantee_met",
        "allocated_gpu_hours",
        "lost_gpu_hours",
        "goodput",
    ):
        assert key in j
    assert j["period_start"] == "2026-01-01T00:00:00+00:00"
    assert j["resolution_rate"] == "0.666667"
    assert isinstance(j["covered_failures"], int)
    assert isinstance(j["guarantee_met"], bool)
    json.dumps(j)
    for key in ("resolution_rate", "allocated_gpu_hours", "lost_gpu_hours", "goodput"):
        assert re.fullmatch(r"-?\d+\.\d{6}", j[key]), key  # fixed six places, no exponent
    for value in j.values():
        assert not isinstance(value, float)


def test_decimal_string_rounds_half_even_once() -> None:
    assert decimal_string(D("0.0000005")) == "0.000000"
    assert decimal_string(D("0.0000015")) == "0.000002"
    assert decimal_string(D("0.00000150000001")) == "0.000002"
    assert decimal_string(D("-0.0000001")) == "0.000000"  # never "-0"
    assert decimal_string(D("-1.2345675")) == "-1.234568"
    assert decimal_string(7) == "7.000000"
    assert decimal_string(D("2.5"), 0) == "2"


# ------------------------------------------------------------------ report rows


def test_failure_rows_statuses_and_order() -> None:
    fs = [
        failure("nc", at(7), cls="planned", cause="maintenance"),
        failure("r", at(1)),
        failure("rb", at(2)),
        failure("fl", at(3)),
        failure("pd", at(4)),
        failure("xc", at(5), cause="facility_power"),
        failure("xe", at(6), cause="customer_code"),
        failure("out", at(400)),
    ]
    os_ = [
        outcome("r", recovery="2", gpus=4),
        outcome("rb", "rolled_back", lost_steps=2, step="5", gpus=1),
        outcome("fl", "failed", recovery="7", gpus=1),
    ]
    rows = failure_rows(
        terms=Terms(),
        period_start=YEAR[0],
        period_end=YEAR[1],
        failures=fs,
        outcomes=os_,
        exclusions=[exclusion("xe", "approved by ops")],
    )
    assert [r.failure.event_id for r in rows] == ["r", "rb", "fl", "pd", "xc", "xe", "nc"]
    assert [r.status for r in rows] == [
        FailureStatus.RESOLVED,
        FailureStatus.ROLLED_BACK,
        FailureStatus.FAILED,
        FailureStatus.PENDING,
        FailureStatus.EXCLUDED,
        FailureStatus.EXCLUDED,
        FailureStatus.NOT_COVERED,
    ]
    assert [r.lost_gpu_seconds for r in rows] == [8, 10, 7, 0, 0, 0, 0]
    assert (rows[4].excluded_by, rows[4].reason) == ("cause", "facility_power")
    # An exclusion entry wins over an excluded cause for the reason shown.
    assert (rows[5].excluded_by, rows[5].reason) == ("exclusion", "approved by ops")
    assert rows[3].outcome is None
    assert rows[6].excluded_by is None and rows[6].reason is None


def test_rows_agree_with_figures() -> None:
    fs = [failure(f"f{i}", at(i), cls=("unplanned", "planned")[i % 2]) for i in range(12)]
    os_ = [outcome(f"f{i}", ("live_migrated", "failed")[i % 3 == 0]) for i in range(0, 12, 2)]
    ex = [exclusion("f4")]
    rows = failure_rows(
        terms=Terms(),
        period_start=YEAR[0],
        period_end=YEAR[1],
        failures=fs,
        outcomes=os_,
        exclusions=ex,
    )
    fig = figures(fs, os_, ex)
    by_status = {s: sum(1 for r in rows if r.status is s) for s in FailureStatus}
    assert by_status[FailureStatus.RESOLVED] == fig.resolved_failures
    assert by_status[FailureStatus.FAILED] == fig.failed_failures
    assert by_status[FailureStatus.PENDING] == fig.pending_failures
    assert by_status[FailureStatus.EXCLUDED] == fig.excluded_failures
    assert by_status[FailureStatus.NOT_COVERED] == fig.not_covered_failures
    assert sum(r.lost_gpu_seconds for r in rows) == fig.lost_gpu_seconds
