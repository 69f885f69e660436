"""The factory the runtime's sink spec names: ``yoco.sink:ledger_sink``."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from ledger.sink import LedgerSink


def ledger_sink(database_url: str | None = None) -> LedgerSink:
    """A :class:`LedgerSink` on ``database_url`` (default: the configured sink login).

    Called inside the runtime's supervisor process: without a URL it attaches to
    the embedded PostgreSQL like any other ``yoco`` process.
    """
    from yoco.app import App, extra_projectors
    from yoco.database import make_engine
    from yoco.settings import Settings

    def engine() -> Engine:
        # The sink's own login (yoco_sink, no superuser), switched to yoco_app.
        if database_url:
            return make_engine(database_url)
        return make_engine(App(Settings()).database.sink_url)

    from yoco.alerting import refusal_recorder

    sink = LedgerSink(engine, extra_projectors())
    # A refused record becomes a dead letter in the runtime's outbox; the operator hears of
    # it through the record_refused alert (docs/alerts.md).
    sink.on_refused = refusal_recorder(lambda: sink.engine, "runtime sink")
    return sink
