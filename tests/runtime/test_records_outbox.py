"""Records, sinks and the durable outbox (single process, fast)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from runtime import records as R
from runtime.errors import RecordError, SinkError, SinkSpecError
from runtime.outbox import Deliverer, DeliveryConfig, Outbox
from runtime.sink import JsonlFileSink, RecordSink, SinkSpec, parse_sink_spec


def test_builders_follow_the_ingestion_table() -> None:
    fail = R.failure(contract_id="c1", job_id="j", failure_class="unplanned",
                     cause="process_killed", node="n1", gpu=3, step=7, detail="w1 exit -9")
    assert set(fail) == {"kind", "event_id", "contract_id", "occurred_at", "job_id",
                         "failure_class", "cause", "node", "gpu", "step", "detail"}
    out = R.outcome(contract_id="c1", failure_event_id=fail["event_id"],
                    outcome="live_migrated", lost_steps=0, recovery_seconds=0.1,
                    step_seconds=0.05, gpus_affected=3)
    assert out["recovery_seconds"] == 0.1 and isinstance(out["lost_steps"], int)
    assert "+00:00" in out["occurred_at"]
    json.dumps(out)  # plain JSON numbers and strings


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.update(extra=1), "extra"),
    (lambda r: r.update(occurred_at="2025-01-01T00:00:00"), "occurred_at"),
    (lambda r: r.update(lost_steps=1), "lost_steps"),
    (lambda r: r.update(step_seconds=0), "step_seconds"),
    (lambda r: r.update(recovery_seconds=-1.0), "recovery_seconds"),
    (lambda r: r.update(gpus_affected=True), "gpus_affected"),
    (lambda r: r.update(event_id="not-a-uuid"), "event_id"),
    (lambda r: r.update(lost_steps=2**53), "lost_steps"),
])
def test_invalid_records_are_refused_naming_the_field(mutate, field) -> None:
    rec = R.outcome(contract_id="c", failure_event_id=R.new_event_id(), outcome="live_migrated",
                    lost_steps=0, recovery_seconds=0.0, step_seconds=1.0, gpus_affected=1)
    mutate(rec)
    with pytest.raises(RecordError, match=field):
        R.validate_record(rec)


def test_jsonl_sink_is_idempotent_and_refuses_conflicts(tmp_path: Path) -> None:
    sink = JsonlFileSink(tmp_path / "s.jsonl")
    assert isinstance(sink, RecordSink)
    rec = R.job_started(contract_id="c", job_id="j", gpus=2)
    sink.deliver([rec])
    sink.deliver([rec, rec])
    assert JsonlFileSink(tmp_path / "s.jsonl").read_all() == [rec]
    with pytest.raises(SinkError):
        JsonlFileSink(tmp_path / "s.jsonl").deliver([rec | {"gpus": 3}])


def test_sink_specs(tmp_path: Path) -> None:
    spec = parse_sink_spec(f"jsonl:{tmp_path}/x.jsonl")
    assert isinstance(spec.build(), JsonlFileSink)
    assert SinkSpec(target="runtime.sink:JsonlFileSink",
                    kwargs={"path": str(tmp_path / "y")}).build().path == tmp_path / "y"
    with pytest.raises(SinkSpecError):
        SinkSpec(target="no.such.module:Thing").build()
    with pytest.raises(SinkSpecError):
        SinkSpec(target="nocolon")


class _Flaky:
    def __init__(self, fail_times: int) -> None:
        self.fail_times = fail_times
        self.stored: list[str] = []
        self.calls = 0

    def deliver(self, records) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise SinkError("down")
        self.stored.extend(r["event_id"] for r in records)


def test_outbox_retries_until_acknowledged(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    recs = [R.job_progress(contract_id="c", job_id="j", step=i, step_seconds=0.1)
            for i in range(5)]
    for r in recs:
        box.append(r)
    sink = _Flaky(fail_times=3)
    d = Deliverer(box, sink, DeliveryConfig(initial_backoff_s=0.01, max_backoff_s=0.02)).start()
    assert d.stop(drain_timeout=5)
    assert sink.stored == [r["event_id"] for r in recs]
    assert d.failures == 3
    assert Outbox(tmp_path).pending_count() == 0  # acknowledgements are durable


def test_outbox_survives_a_torn_tail_and_a_crash_before_ack(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    a = R.job_started(contract_id="c", job_id="j", gpus=1)
    b = R.job_finished(contract_id="c", job_id="j", step=3)
    box.append(a)
    box.append(b)
    with (tmp_path / "records.jsonl").open("a") as fh:
        fh.write('{"kind": "job_pro')  # crash mid-append: never acknowledged to anyone
    # "Crash" after the sink stored `a` but before the ack was written: `a` comes again.
    sink = JsonlFileSink(tmp_path / "sink.jsonl")
    sink.deliver([a])
    box2 = Outbox(tmp_path)
    assert [r["event_id"] for r in box2.pending()] == [a["event_id"], b["event_id"]]
    Deliverer(box2, sink).deliver_once()
    assert [r["event_id"] for r in sink.read_all()] == [a["event_id"], b["event_id"]]
    box2.append(R.job_started(contract_id="c", job_id="k", gpus=1))
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert all(json.loads(ln) for ln in lines) and len(lines) == 3


def test_outbox_append_is_thread_safe(tmp_path: Path) -> None:
    box = Outbox(tmp_path)

    def work() -> None:
        for i in range(50):
            box.append(R.job_progress(contract_id="c", job_id="j", step=i, step_seconds=1.0))

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert Outbox(tmp_path).pending_count() == 200
