"""The ledger as the runtime's record sink: idempotent delivery, refusals that name the record."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.contracts import add_contracts
from ledger.errors import IngestRefused
from ledger.records import parse_contracts
from runtime.sink import RecordSink, SinkSpec
from tests import factories as f
from yoco.database import unit_of_work


@pytest.fixture
def sink(engine, sink_url):
    specs, errors = parse_contracts(f.jsonl([f.contract("C-1")]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    built = SinkSpec(target="yoco.sink:ledger_sink", kwargs={"database_url": sink_url}).build()
    yield built
    built.close()


def test_spec_builds_a_record_sink_and_delivery_is_idempotent(sink, engine) -> None:
    assert isinstance(sink, RecordSink)
    fail = f.failure()
    batch = [f.job_started(), fail, f.outcome(fail["event_id"], at=f.later(1))]
    sink.deliver(batch)
    sink.deliver(batch)  # the outbox retried after a lost acknowledgement
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM journal_entries")).scalar() == 4
    assert sink.delivered == 3


def test_a_refused_batch_names_the_record_and_writes_nothing(sink, engine) -> None:
    bad = f.outcome("00000000-0000-4000-8000-000000000001")
    with pytest.raises(IngestRefused) as exc:
        sink.deliver([f.job_started(), bad])
    assert exc.value.errors[0].index == 1
    assert exc.value.errors[0].field == "failure_event_id"
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM journal_entries")).scalar() == 1


def test_a_refusal_is_permanent_an_outage_is_not() -> None:
    from sqlalchemy.exc import OperationalError

    from ledger.sink import LedgerSink
    from runtime.sink import is_permanent_refusal

    sink = LedgerSink(lambda: None)  # type: ignore[arg-type, return-value]
    assert is_permanent_refusal(sink, IngestRefused(["line 1: cause: bad"]))
    assert not is_permanent_refusal(sink, OperationalError("SELECT 1", {}, Exception("down")))
    assert not is_permanent_refusal(sink, ConnectionRefusedError())
