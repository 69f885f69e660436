"""The runtime's ledger sink: a refused record (a dead letter) raises record_refused once."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import text

from runtime.outbox import Deliverer, Outbox, resend_dead_letters
from tests import factories as fx
from tests.billing.conftest import add_contract
from yoco.sink import ledger_sink


def _events(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(
            "SELECT key, kind, contract_id, subject, data FROM alert_events ORDER BY id"))]


def test_a_dead_letter_raises_one_alert_and_a_resend_none(engine, sink_url, tmp_path) -> None:
    add_contract(engine, "C-1", start_date="2026-01-01")
    sink = ledger_sink(sink_url)
    outbox = Outbox(tmp_path / "outbox")
    good = fx.rec("job_started", "C-1", fx.T0, job_id="j1", gpus=8)
    ghost = fx.outcome(str(uuid.uuid4()), cid="C-1", at=fx.T0 + timedelta(minutes=5))
    outbox.append(good)
    outbox.append(ghost)
    deliverer = Deliverer(outbox, sink)
    try:
        # The batch is refused, narrowed down record by record: the good one lands, the
        # ghost outcome becomes a dead letter — and one alert.
        assert deliverer.deliver_once() == 2
        assert [d.event_id for d in outbox.dead_letters()] == [ghost["event_id"]]
        [(key, kind, cid, subject, data)] = _events(engine)
        assert kind == "record_refused" and cid == "C-1"
        assert data["source"] == "runtime sink"
        assert [r["event_id"] for r in data["records"]] == [ghost["event_id"]]
        assert data["records"][0]["errors"][0]["message"]
        assert ghost["event_id"] in subject
        # Re-sending the dead letter is refused again: the same content, no new alert.
        [res] = resend_dead_letters(outbox, sink)
        assert not res.delivered
        assert [e[0] for e in _events(engine)] == [key]
    finally:
        sink.close()
