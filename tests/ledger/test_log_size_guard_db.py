"""A log's size only ever follows its journal; one bad log never stops another's
checkpoint. Real PostgreSQL, the real roles, the real command line."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from ledger.contracts import add_contracts
from ledger.ingest import ingest, line_locator
from ledger.records import parse_contracts, parse_jsonl
from tests import factories as f
from yoco.cli import build_app
from yoco.database import unit_of_work

app = build_app()
runner = CliRunner()
TRIGGER = "ledger_logs_size_follows_journal"


def _setup(engine, *cids: str) -> None:
    specs, errors = parse_contracts(f.jsonl([f.contract(c) for c in cids]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)
    for cid in cids:
        recs, errors = parse_jsonl(f.jsonl([f.failure(cid=cid, at=f.later(i))
                                            for i in range(3)]))
        assert not errors, errors
        with unit_of_work(engine) as s:
            ingest(s, recs, line_locator([r.line or 0 for r in recs]))


def _sizes(engine) -> dict[str, int]:
    with engine.connect() as c:
        return dict(c.execute(text("SELECT log_id, size FROM ledger_logs")).all())


@pytest.mark.parametrize("who", ["engine", "rebuild_engine", "owner_engine"])
@pytest.mark.parametrize("sql", [
    "UPDATE ledger_logs SET size = size + 1000 WHERE log_id = 'C-1'",
    "UPDATE ledger_logs SET size = size - 1 WHERE log_id = 'C-1'",
    "INSERT INTO ledger_logs (log_id, size) VALUES ('C-9', 7)",
])
def test_no_role_may_write_a_size_its_journal_does_not_give(request, who: str, sql: str) -> None:
    """The issue's attack (yoco_app raising a log's size), and the same by the owner and a
    superuser: refused when the transaction commits, naming the log; nothing written."""
    engine = request.getfixturevalue("engine")
    _setup(engine, "C-1")
    before = _sizes(engine)
    eng = request.getfixturevalue(who)
    with pytest.raises(DBAPIError, match="size only ever follows its journal"), \
            eng.begin() as c:
        c.execute(text(sql))
    assert _sizes(engine) == before


def test_appends_still_pass_the_check_several_in_one_transaction(engine) -> None:
    """The ordinary path: two appends to one log in one transaction are checked against
    their sum when it commits."""
    _setup(engine, "C-1")
    recs, errors = parse_jsonl(f.jsonl([f.failure(at=f.later(10 + i)) for i in range(4)]))
    assert not errors
    with unit_of_work(engine) as s:
        ingest(s, recs[:2], line_locator([r.line or 0 for r in recs[:2]]))
        ingest(s, recs[2:], line_locator([r.line or 0 for r in recs[2:]]))
    assert _sizes(engine)["C-1"] == 8  # the contract entry, 3 failures, 4 more


def _break_size(db_url: str, log_id: str, size: int) -> None:
    """What the issue's attacker did before the guard: a wrong size (only a superuser who
    first disables the guard can do it now)."""
    eng = create_engine(db_url)
    try:
        with eng.begin() as c:
            c.execute(text(f"ALTER TABLE ledger_logs DISABLE TRIGGER {TRIGGER}"))
            c.execute(text("UPDATE ledger_logs SET size = :n WHERE log_id = :l"),
                      {"n": size, "l": log_id})
            c.execute(text(f"ALTER TABLE ledger_logs ENABLE ALWAYS TRIGGER {TRIGGER}"))
    finally:
        eng.dispose()


@pytest.mark.parametrize("size", [1000, 2])
def test_one_inconsistent_log_never_stops_the_others_checkpoints(
        yoco_env, engine, db_url, size: int) -> None:
    """`yoco ledger checkpoint` names the bad log (its size and its journal), signs every
    other log, and exits 1 at the end — never a traceback."""
    _setup(engine, "C-1", "C-2", "C-3")
    _break_size(db_url, "C-2", size)
    result = runner.invoke(app, ["ledger", "checkpoint"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "signed: C-1 size 4" in result.output and "signed: C-3 size 4" in result.output
    assert "NOT SIGNED: log 'C-2'" in result.output
    assert f"recorded size is {size} but its journal holds 4 entries" in result.output
    with engine.connect() as c:
        signed = c.execute(text("SELECT log_id FROM checkpoints ORDER BY log_id")).scalars()
        assert list(signed) == ["C-1", "C-3"]


def test_missing_merkle_nodes_are_a_named_error_for_that_log_only(
        yoco_env, engine, db_url) -> None:
    """The tree itself broken (a leaf under a node deleted by a superuser: below height
    ``ledger.tree.STORED_FROM`` the nodes are recomputed from the journal's leaf hashes,
    and the log's last entry still says it holds them all): that log is named, the
    others are signed."""
    _setup(engine, "C-1", "C-2")
    eng = create_engine(db_url)
    try:
        with eng.begin() as c:
            triggers = c.execute(text(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'journal_entries'::regclass "
                "AND NOT tgisinternal")).scalars().all()
            for t in triggers:
                c.execute(text(f"ALTER TABLE journal_entries DISABLE TRIGGER {t}"))
            c.execute(text("DELETE FROM journal_entries WHERE log_id = 'C-1' AND seq = 1"))
            for t in triggers:
                c.execute(text(f"ALTER TABLE journal_entries ENABLE ALWAYS TRIGGER {t}"))
    finally:
        eng.dispose()
    result = runner.invoke(app, ["ledger", "checkpoint"])
    assert result.exit_code == 1, result.output
    assert "NOT SIGNED: log 'C-1'" in result.output and "Merkle nodes" in result.output
    assert "signed: C-2 size 4" in result.output
