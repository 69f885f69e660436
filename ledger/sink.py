"""The ledger as a record sink for the runtime (it implements ``runtime.sink.RecordSink``).

The runtime does not import the ledger: the composition root names
``yoco.sink:ledger_sink`` in the runtime's sink spec, and the supervisor builds
the sink in its own process.  ``deliver`` goes through the one ingest path,
:func:`ledger.ingest.ingest_batch`, like ``yoco ledger ingest`` and the API: it
validates the batch, appends it in one unit of work and returns only after the
commit: the outbox may then drop the batch.  Records already stored with
the same content are no-ops, so a retried batch is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from ledger import ingest as ingestion
from ledger.errors import IngestRefused
from ledger.projections import Projector
from ledger.sessions import unit_of_work


class LedgerSink:
    """Delivers runtime records into the ledger; raises (so the outbox retries) on failure.

    A batch the ledger refuses (:class:`~ledger.errors.IngestRefused`) is a
    permanent error: retrying it cannot succeed, and the exception says which
    record and field.  Connection errors are transient.
    """

    def __init__(
        self,
        engine_factory: Callable[[], Engine],
        projectors: Sequence[Projector] = (),
        on_refused: Callable[[Sequence[Any], Sequence[Any]], None] | None = None,
    ) -> None:
        self._engine_factory = engine_factory
        self._engine: Engine | None = None
        self._projectors = list(projectors)
        #: Told ``(records, errors)`` of every refused batch, after the rollback (the
        #: composition root raises the ``record_refused`` alert with it); must not raise.
        self.on_refused = on_refused
        self.delivered = 0

    @property
    def engine(self) -> Engine:
        """The engine, created on first delivery (in the process that delivers)."""
        if self._engine is None:
            self._engine = self._engine_factory()
        return self._engine

    def deliver(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Validate and append ``records`` in one transaction; return after the commit.

        The engine is created only once the batch has validated.
        """
        objs = [dict(r) for r in records]
        try:
            result = ingestion.ingest_batch(
                lambda: unit_of_work(self.engine),
                ingestion.RecordBatch(objs, what="runtime batch"),
                self._projectors,
            )
        except IngestRefused as exc:
            if self.on_refused is not None:
                self.on_refused(objs, exc.errors)
            raise
        self.delivered += result.appended

    def is_permanent(self, exc: BaseException) -> bool:
        """True when ``exc`` (raised by :meth:`deliver`) is a refusal: the ledger will
        never accept that content, so the runtime's outbox dead-letters the record
        instead of retrying it. Anything else (connection lost, database down) is an
        outage that the outbox retries."""
        return isinstance(exc, IngestRefused)

    def close(self) -> None:
        """Release the engine's connections."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
