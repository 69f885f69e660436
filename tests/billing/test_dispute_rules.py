"""Dispute rules of billing itself (so the command line keeps them too, not only the portal):
one open dispute per failure, and nobody decides a dispute they opened."""

from __future__ import annotations

import pytest

from billing.disputes import open_dispute, reject_dispute, resolve_dispute
from billing.errors import DisputeAlreadyOpen, SelfDecision
from tests.billing.conftest import add_contract, counts, failures, ingest_records
from yoco.database import unit_of_work

TABLES = ("journal_entries", "billing_disputes", "exclusions")


def test_one_open_dispute_per_failure(engine) -> None:
    add_contract(engine)
    recs, ids = failures(unresolved=2)
    ingest_records(engine, recs)
    with unit_of_work(engine) as s:
        first = open_dispute(s, "C-1", ids[0], reason="r", opened_by="acme")
    before = counts(engine, *TABLES)
    for n in range(3):
        with pytest.raises(DisputeAlreadyOpen, match="already has an open dispute"), \
                unit_of_work(engine) as s:
            open_dispute(s, "C-1", ids[0], reason=f"again {n}", opened_by="acme")
    assert counts(engine, *TABLES) == before
    with unit_of_work(engine) as s:  # another failure is another matter
        open_dispute(s, "C-1", ids[1], reason="r", opened_by="acme")
    with unit_of_work(engine) as s:
        reject_dispute(s, first.dispute["dispute_id"], decided_by="ops", note="no")
    with unit_of_work(engine) as s:  # decided: the failure may be disputed again
        open_dispute(s, "C-1", ids[0], reason="new evidence", opened_by="acme")


def test_nobody_decides_a_dispute_they_opened(engine) -> None:
    add_contract(engine)
    recs, ids = failures(unresolved=1)
    ingest_records(engine, recs)
    with unit_of_work(engine) as s:
        did = open_dispute(s, "C-1", ids[0], reason="r", opened_by="Olga").dispute["dispute_id"]
    before = counts(engine, *TABLES)
    for decide in (
        lambda s: resolve_dispute(s, did, resolution="exclusion", decided_by="olga ",
                                  note="mine"),
        lambda s: reject_dispute(s, did, decided_by="Olga", note="mine"),
    ):
        with pytest.raises(SelfDecision, match="may not decide"), unit_of_work(engine) as s:
            decide(s)
    assert counts(engine, *TABLES) == before
    with unit_of_work(engine) as s:
        resolve_dispute(s, did, resolution="exclusion", decided_by="Pat", note="confirmed")
