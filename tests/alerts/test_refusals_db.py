"""The runtime's ledger sink: a refused record (a dead letter) raises record_refused once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
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


def _refuse(engine, cid: str | None, now, n: int = 1) -> list[int | None]:
    """``n`` distinct refused one-record batches naming ``cid``, one second apart."""
    from datetime import timedelta as td

    from alerts.refusals import record_refusal
    from ledger.records import RecordError
    from yoco.database import unit_of_work

    ids = []
    for i in range(n):
        obj = {"kind": "job_started", "event_id": str(uuid.uuid4()), "contract_id": cid,
               "gpus": 0}
        with unit_of_work(engine) as s:
            ids.append(record_refusal(s, [obj], [RecordError("must be > 0", field="gpus",
                                                             index=0)],
                                      source="API", now=now + td(seconds=i)))
    return ids


def _sent_and_held(engine, cid: str | None, dests: int = 1) -> tuple[int, int, int, int]:
    """(events sent one by one, held back, flood notices, deliveries) of ``cid``."""
    with engine.connect() as c:
        rows = c.execute(text(
            "SELECT e.key, e.data, count(d.id) FROM alert_events e "
            "LEFT JOIN alert_deliveries d ON d.event_id = e.id "
            "WHERE e.kind = 'record_refused' AND e.contract_id IS NOT DISTINCT FROM :c "
            "GROUP BY e.id ORDER BY e.id"), {"c": cid}).all()
    flood = [r for r in rows if r[0].startswith("record_refused:flood:")]
    held = [r for r in rows if "held_back" in r[1]]
    sent = [r for r in rows if r not in flood and r not in held]
    assert all(r[2] == 0 for r in held)  # held back: in the log, never sent
    assert all(r[2] == dests for r in sent + flood)  # one delivery per destination
    return len(sent), len(held), len(flood), sum(r[2] for r in rows)


def test_a_flood_of_refusals_sends_ten_then_one_notice_and_logs_the_rest(engine) -> None:
    from datetime import UTC, datetime

    from alerts.refusals import REFUSALS_PER_WINDOW, window_start
    from alerts.services import add_webhook
    from yoco.database import unit_of_work

    add_contract(engine, "C-1", start_date="2026-01-01")
    add_contract(engine, "C-2", start_date="2026-01-01", customer="Other")
    with unit_of_work(engine) as s:
        add_webhook(s, name="ops", url="http://127.0.0.1:9/hook")
    now = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    assert REFUSALS_PER_WINDOW == 10
    ids = _refuse(engine, "C-1", now, 25)
    assert all(i is not None for i in ids)  # every refusal is in the event log
    assert _sent_and_held(engine, "C-1") == (10, 15, 1, 11)
    with engine.connect() as c:
        key, subject, data = c.execute(text(
            "SELECT key, subject, data FROM alert_events WHERE key LIKE 'record_refused:flood:%'"
        )).one()
    start = window_start(now)
    assert key == f"record_refused:flood:C-1:{start.isoformat()}"
    assert "more than 10" in subject and data["window_end"] == "2026-06-01T12:10:00+00:00"
    # Another contract has its own count; refusals of no contract count together.
    _refuse(engine, "C-2", now, 3)
    assert _sent_and_held(engine, "C-2") == (3, 0, 0, 3)
    _refuse(engine, None, now, 12)
    assert _sent_and_held(engine, None) == (10, 2, 1, 11)
    # The next window sends again, one by one.
    later = now.replace(minute=10, second=5)
    _refuse(engine, "C-1", later, 2)
    assert _sent_and_held(engine, "C-1") == (12, 15, 1, 13)


def test_a_refusal_raised_again_is_not_counted_nor_held(engine) -> None:
    from datetime import UTC, datetime

    from alerts.refusals import raise_refusal, refusal_event
    from ledger.records import RecordError
    from yoco.database import unit_of_work

    add_contract(engine, "C-1", start_date="2026-01-01")
    now = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
    obj = {"kind": "job_started", "event_id": str(uuid.uuid4()), "contract_id": "C-1"}
    event = refusal_event([obj], [RecordError("x", field="gpus", index=0)], source="API",
                          now=now)
    with unit_of_work(engine) as s:
        assert raise_refusal(s, event) is not None
    for _ in range(15):
        with unit_of_work(engine) as s:
            assert raise_refusal(s, event) is None
    assert _sent_and_held(engine, "C-1", dests=0) == (1, 0, 0, 0)
    with unit_of_work(engine) as s, pytest.raises(ValueError):
        raise_refusal(s, event, limit=0)
