"""Reports read the ledger through their own checkpoint-bounded loader
(:func:`reports.data.load_at_checkpoint`); it must give exactly billing's records
(:func:`billing.services.load_period`) when the checkpoint covers the whole log, and only
entries under the checkpoint otherwise."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from billing.services import load_period
from ledger import journal
from reports.data import load_at_checkpoint
from tests.billing.conftest import add_contract
from tests.billing.test_sla_sql_db import START, _random_ledger

PERIODS = [
    (START, START + timedelta(days=365)),
    (START + timedelta(days=31), START + timedelta(days=59)),
    (START - timedelta(days=400), START + timedelta(days=800)),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_full_checkpoint_gives_billings_records(engine, seed: int) -> None:
    add_contract(engine)
    _random_ledger(engine, random.Random(seed))
    with Session(engine) as s:
        size = journal.log_size(s, "C-1")
        seen = 0
        for start, end in PERIODS:
            want = load_period(s, "C-1", start, end)
            got = load_at_checkpoint(s, "C-1", start, end, size).records
            for name in ("failures", "outcomes", "exclusions", "jobs"):
                assert sorted(getattr(got, name), key=repr) == sorted(
                    getattr(want, name), key=repr
                ), name
            seen += len(got.failures)
        assert seen > 20  # the comparison is not over empty lists


@pytest.mark.parametrize("seed", [4, 5])
def test_smaller_checkpoint_sees_only_the_entries_under_it(engine, seed: int) -> None:
    add_contract(engine)
    _random_ledger(engine, random.Random(seed))
    with Session(engine) as s:
        size = journal.log_size(s, "C-1")
        cut = size // 2
        start, end = PERIODS[2]
        everything = load_period(s, "C-1", start, end)
        got = load_at_checkpoint(s, "C-1", start, end, cut).records
        for name in ("failures", "outcomes", "exclusions"):
            want_ids = sorted(r.event_id for r in getattr(everything, name) if r.seq < cut)
            assert sorted(r.event_id for r in getattr(got, name)) == want_ids, name
        assert len(got.failures) < len(everything.failures)
