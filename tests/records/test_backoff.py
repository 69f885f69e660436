"""The one backoff rule (yoco_records.backoff) and its two users: the runtime's outbox
and the alerts' deliveries (fast, no database)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alerts.config import RetryPolicy
from runtime import records as R
from runtime.errors import SinkError
from runtime.outbox import Deliverer, DeliveryConfig, Outbox
from yoco_records.backoff import backoff_s


def test_the_wait_doubles_up_to_the_cap_and_jitter_spreads_its_second_half() -> None:
    full = [backoff_s(n, base_s=1.0, cap_s=8.0) for n in range(1, 7)]
    low = [backoff_s(n, base_s=1.0, cap_s=8.0, jitter=0.0) for n in range(1, 7)]
    mid = [backoff_s(n, base_s=1.0, cap_s=8.0, jitter=0.5) for n in range(1, 7)]
    assert full == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert low == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert mid == [0.75, 1.5, 3.0, 6.0, 6.0, 6.0]


def test_a_long_outage_stays_at_the_cap() -> None:
    # An outbox retrying every few seconds through a day-long outage counts tens of
    # thousands of failures: 2**n must not overflow.
    assert backoff_s(50_000, base_s=0.05, cap_s=5.0) == 5.0
    assert backoff_s(10**9, base_s=0.05, cap_s=5.0, jitter=0.0) == 2.5


@given(failed=st.integers(1, 10_000),
       base=st.floats(1e-3, 100.0), extra=st.floats(0.0, 3600.0),
       jitter=st.floats(0.0, 1.0))
def test_every_wait_lies_in_the_second_half_of_the_capped_full_wait(
        failed: int, base: float, extra: float, jitter: float) -> None:
    cap = base + extra
    full = backoff_s(failed, base_s=base, cap_s=cap)
    wait = backoff_s(failed, base_s=base, cap_s=cap, jitter=jitter)
    assert full == min(cap, base * 2.0 ** min(failed - 1, 64))
    assert full / 2 <= wait <= full <= cap
    assert backoff_s(failed + 1, base_s=base, cap_s=cap, jitter=jitter) >= wait


@pytest.mark.parametrize("kwargs, field", [
    ({"failed": 0}, "failed"),
    ({"failed": True}, "failed"),
    ({"failed": 1.5}, "failed"),
    ({"jitter": 1.01}, "jitter"),
    ({"jitter": -0.1}, "jitter"),
    ({"jitter": float("nan")}, "jitter"),
    ({"base_s": 0.0}, "base_s"),
    ({"base_s": 2.0, "cap_s": 1.0}, "base_s"),
    ({"base_s": float("nan")}, "base_s"),
])
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"failed": 1, "base_s": 1.0, "cap_s": 2.0, "jitter": 0.5, **kwargs}
    with pytest.raises(ValueError, match=f"^{field}"):
        backoff_s(args.pop("failed"), **args)


def test_the_alerts_retry_policy_waits_by_the_rule() -> None:
    p = RetryPolicy(max_attempts=10, base_s=1.5, cap_s=20.0)
    for n in range(1, 10):
        for j in (0.0, 0.3, 1.0):
            assert p.backoff(n, j) == backoff_s(n, base_s=1.5, cap_s=20.0, jitter=j)


class _Down:
    """A sink that fails its first ``fail_times`` deliveries (an outage), then stores."""

    def __init__(self, fail_times: int) -> None:
        self.fail_times = fail_times
        self.calls = 0
        self.stored: list[str] = []

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise SinkError("down")
        self.stored.extend(str(r["event_id"]) for r in records)


def test_the_outbox_waits_by_the_rule(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The waits it announces after each consecutive failure: each in the second half of
    # the rule's full wait (0.01 s doubled, capped at 0.04 s).
    box = Outbox(tmp_path)
    rec = R.job_progress(contract_id="c", job_id="j", step=1, step_seconds=0.1)
    box.append(rec)
    sink = _Down(fail_times=5)
    with caplog.at_level(logging.WARNING, logger="yoco.runtime.outbox"):
        d = Deliverer(box, sink, DeliveryConfig(initial_backoff_s=0.01, max_backoff_s=0.04))
        d.start()
        assert d.stop(drain_timeout=10)
    assert sink.stored == [rec["event_id"]]
    waits = [float(m.group(1)) for r in caplog.records
             if (m := re.search(r"retrying in ([0-9.]+)s", r.getMessage()))]
    assert len(waits) == 5
    for n, wait in enumerate(waits, start=1):
        full = backoff_s(n, base_s=0.01, cap_s=0.04)
        # the log shows two decimals
        assert round(full / 2, 2) - 0.005 <= wait <= round(full, 2) + 0.005, (n, wait)
