"""Fixtures of the adapter tests: a contract in a real ledger, and reading its journal."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from ledger.contracts import add_contracts
from ledger.records import parse_contracts
from tests import factories as f
from yoco.database import unit_of_work

CONTRACT = "C-ADAPT"


@pytest.fixture
def ledger_contract(engine: Engine) -> str:
    """A contract in the test's ledger; records for it are accepted."""
    specs, errors = parse_contracts(f.jsonl([f.contract(CONTRACT)]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    return CONTRACT


@pytest.fixture
def journal(engine: Engine) -> Callable[[], list[dict[str, Any]]]:
    """The runtime records of the ledger's journal (bodies, in ledger order)."""

    def read() -> list[dict[str, Any]]:
        with engine.connect() as c:
            rows = c.execute(text(
                "SELECT canonical FROM journal_entries WHERE kind IN ('job_started', "
                "'job_progress', 'failure', 'outcome', 'job_finished') ORDER BY log_id, seq"))
            return [json.loads(bytes(r[0])) for r in rows]

    return read


def by_kind(recs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        out.setdefault(r["kind"], []).append(r)
    return out
