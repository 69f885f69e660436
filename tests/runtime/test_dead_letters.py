"""Permanent refusals go to the dead letters while later records keep flowing; outages
are retried; ``yoco outbox`` lists, delivers and re-sends (single process, fast)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runtime import records as R
from runtime.errors import RecordRefused, SinkError
from runtime.outbox import Deliverer, DeliveryConfig, Outbox, resend_dead_letters
from runtime.sink import JsonlFileSink, is_permanent_refusal


class _Picky:
    """Refuses (permanently) every record of a kind in ``refuse``; down while ``down``."""

    def __init__(self, path: Path, refuse: set[str]) -> None:
        self.inner = JsonlFileSink(path)
        self.refuse = refuse
        self.down = False
        self.calls = 0

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        self.calls += 1
        if self.down:
            raise SinkError("connection refused")
        bad = [r for r in records if r["kind"] in self.refuse]
        if bad:
            raise RecordRefused(f"{bad[0]['kind']} {bad[0]['event_id']}: contract unknown")
        self.inner.deliver(records)


def _records() -> list[dict[str, Any]]:
    fail = R.failure(contract_id="c", job_id="j", failure_class="unplanned",
                     cause="process_killed", detail="w1 exit -9", step=3)
    return [R.job_started(contract_id="c", job_id="j", gpus=2),
            R.job_progress(contract_id="c", job_id="j", step=2, step_seconds=0.1),
            fail,
            R.outcome(contract_id="c", failure_event_id=fail["event_id"],
                      outcome="live_migrated", lost_steps=0, recovery_seconds=0.2,
                      step_seconds=0.1, gpus_affected=2),
            R.job_finished(contract_id="c", job_id="j", step=9)]


def test_a_refused_record_is_dead_lettered_loudly_and_later_ones_flow(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    box = Outbox(tmp_path / "outbox")
    recs = _records()
    for r in recs:
        box.append(r)
    sink = _Picky(tmp_path / "sink.jsonl", refuse={"job_progress"})
    with caplog.at_level(logging.ERROR, logger="yoco.runtime.outbox"):
        d = Deliverer(box, sink, DeliveryConfig(initial_backoff_s=0.01)).start()
        assert d.stop(drain_timeout=10)  # nothing stalls behind the refused record
    stored = [r["event_id"] for r in sink.inner.read_all()]
    assert stored == [r["event_id"] for i, r in enumerate(recs) if i != 1]
    assert any("DEAD LETTER" in m and recs[1]["event_id"] in m for m in caplog.messages)
    # Durable: a new outbox on the same folder has nothing pending and one dead letter.
    again = Outbox(tmp_path / "outbox")
    assert again.pending_count() == 0
    [letter] = again.dead_letters()
    assert letter.event_id == recs[1]["event_id"] and "contract unknown" in letter.reason
    # Fixed on the sink side: re-sending delivers it and it leaves the dead letters.
    sink.refuse = set()
    [res] = resend_dead_letters(again, sink)
    assert res.delivered
    assert Outbox(tmp_path / "outbox").dead_letters() == []
    assert recs[1]["event_id"] in [r["event_id"] for r in sink.inner.read_all()]


def test_an_outage_is_retried_never_dead_lettered(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox")
    for r in _records():
        box.append(r)
    sink = _Picky(tmp_path / "sink.jsonl", refuse=set())
    sink.down = True
    d = Deliverer(box, sink, DeliveryConfig(initial_backoff_s=0.01, max_backoff_s=0.02))
    d.start()
    assert not box.wait_drained(0.3)
    assert d.last_error is not None and "connection refused" in d.last_error
    sink.down = False
    assert d.stop(drain_timeout=10)
    assert box.dead_letters() == [] and len(sink.inner.read_all()) == 5
    assert d.last_error is None


def test_a_resend_during_an_outage_keeps_the_letters(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox")
    recs = _records()
    for r in recs:
        box.append(r)
    sink = _Picky(tmp_path / "sink.jsonl", refuse={"job_progress", "job_finished"})
    Deliverer(box, sink).deliver_once()
    assert len(box.dead_letters()) == 2
    sink.down = True
    results = resend_dead_letters(box, sink)
    assert [r.delivered for r in results] == [False, False]
    assert all("sink unreachable" in r.reason for r in results)
    assert len(Outbox(tmp_path / "outbox").dead_letters()) == 2


def test_refusal_classification() -> None:
    class Hooked:
        def deliver(self, records: Sequence[Mapping[str, Any]]) -> None: ...

        def is_permanent(self, exc: BaseException) -> bool:
            return isinstance(exc, KeyError)

    assert is_permanent_refusal(object(), RecordRefused("x"))
    assert not is_permanent_refusal(object(), SinkError("down"))
    assert not is_permanent_refusal(object(), OSError("down"))
    assert is_permanent_refusal(Hooked(), KeyError("x"))
    assert not is_permanent_refusal(Hooked(), TimeoutError())


def test_jsonl_sink_conflict_is_a_permanent_refusal(tmp_path: Path) -> None:
    sink = JsonlFileSink(tmp_path / "s.jsonl")
    rec = R.job_started(contract_id="c", job_id="j", gpus=2)
    sink.deliver([rec])
    with pytest.raises(RecordRefused) as exc:
        sink.deliver([rec | {"gpus": 3}])
    assert is_permanent_refusal(sink, exc.value)


def test_yoco_outbox_list_deliver_and_resend(tmp_path: Path) -> None:
    from yoco.cli_runtime import app

    runs = tmp_path / "runs"
    box = Outbox(runs / "j1" / "outbox")
    recs = _records()
    for r in recs:
        box.append(r)
    # The ledger refused the progress record; the rest is pending (it was unreachable).
    box.dead_letter(recs[1]["event_id"], "RecordRefused: contract unknown")
    runner = CliRunner()
    base = ["--runs-root", str(runs)]
    res = runner.invoke(app, ["outbox", "list", "j1", *base])
    assert res.exit_code == 3, res.output
    assert "4 pending, 1 dead letter(s)" in res.output and "contract unknown" in res.output
    res = runner.invoke(app, ["outbox", "list", "j1", "--json", *base])
    rows = [json.loads(ln) for ln in res.output.splitlines()]
    assert [r["state"] for r in rows].count("dead_letter") == 1
    sink = f"jsonl:{tmp_path / 'ledger.jsonl'}"
    res = runner.invoke(app, ["outbox", "deliver", "j1", "--sink", sink, *base])
    assert res.exit_code == 3 and "0 pending; 1 dead letter(s)" in res.output, res.output
    res = runner.invoke(app, ["outbox", "resend", "j1", "no-such-id", "--sink", sink, *base])
    assert res.exit_code == 2 and "no dead letter" in res.output
    res = runner.invoke(app, ["outbox", "resend", "j1", "--sink", sink, *base])
    assert res.exit_code == 0 and "delivered" in res.output, res.output
    res = runner.invoke(app, ["outbox", "list", "j1", *base])
    assert res.exit_code == 0 and "0 pending, 0 dead letter(s)" in res.output
    stored = JsonlFileSink(tmp_path / "ledger.jsonl").read_all()
    assert sorted(r["event_id"] for r in stored) == sorted(r["event_id"] for r in recs)
    res = runner.invoke(app, ["outbox", "list", "nope", *base])
    assert res.exit_code == 2 and "no outbox" in res.output
