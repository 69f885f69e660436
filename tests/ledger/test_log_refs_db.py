"""Migration 0019: a journal entry or Merkle node must name a ledger log, checked per statement.

The row-by-row foreign keys to ``ledger_logs`` became one check per INSERT or COPY
statement; these tests hold that the guarantee did not change: a bad reference is
refused with a clear error and writes nothing, whatever the role and the write path,
and the referenced logs cannot go away.
"""

from __future__ import annotations

import hashlib
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import migrations
from ledger import merkle, tree
from ledger.bulk import copy_rows
from ledger.contracts import add_contracts
from ledger.ingest import ingest
from ledger.journal import JOURNAL_COLUMNS, JOURNAL_TYPES
from ledger.records import parse_contracts, parse_jsonl
from tests import factories as f
from yoco.database import unit_of_work

FKS = {"fk_journal_entries_log_id_ledger_logs", "fk_merkle_nodes_log_id_ledger_logs"}


def _foreign_keys(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return set(
                c.execute(
                    text(
                        "SELECT conname FROM pg_constraint WHERE contype = 'f' "
                        "AND conrelid::regclass::text IN ('journal_entries', 'merkle_nodes')"
                    )
                ).scalars()
            )
    finally:
        eng.dispose()


def _triggers(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return set(
                c.execute(
                    text(
                        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgname IN "
                        "('journal_entries_log_refs', 'merkle_nodes_log_refs', "
                        "'ledger_logs_keep', 'ledger_logs_no_truncate')"
                    )
                ).scalars()
            )
    finally:
        eng.dispose()


def test_migration_0019_upgrades_and_downgrades(empty_db_url: str) -> None:
    migrations.upgrade(empty_db_url, "0018")
    assert _foreign_keys(empty_db_url) == FKS and _triggers(empty_db_url) == set()
    migrations.upgrade(empty_db_url, "0019")
    assert _foreign_keys(empty_db_url) == set()
    assert len(_triggers(empty_db_url)) == 4
    migrations.downgrade(empty_db_url, "0018")
    assert _foreign_keys(empty_db_url) == FKS and _triggers(empty_db_url) == set()
    migrations.upgrade(empty_db_url)
    assert _foreign_keys(empty_db_url) == set() and len(_triggers(empty_db_url)) == 4


def _setup_contract(engine, cid: str = "C-1") -> None:
    specs, errors = parse_contracts(f.jsonl([f.contract(cid)]))
    assert not errors
    with unit_of_work(engine) as s:
        add_contracts(s, specs)


def _journal_row(log_id: str, seq: int) -> tuple[object, ...]:
    canonical = b'{"kind":"x","n":%d}' % seq
    return (
        seq,
        uuid.uuid4(),
        log_id,
        "x",
        log_id,
        None,
        canonical,
        merkle.leaf_hash(canonical),
    )


def _counts(engine) -> tuple[int, int]:
    with engine.connect() as c:
        return (
            c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one(),
            c.execute(text("SELECT count(*) FROM merkle_nodes")).scalar_one(),
        )


@pytest.mark.parametrize("path", ["copy", "insert"])
@pytest.mark.parametrize("table", ["journal_entries", "merkle_nodes"])
def test_a_row_naming_no_log_is_refused_and_its_statement_writes_nothing(
    engine, path: str, table: str
) -> None:
    """One good row and one bad in the same statement: the statement fails as a whole."""
    _setup_contract(engine)
    before = _counts(engine)
    if table == "journal_entries":
        columns: tuple[str, ...] = JOURNAL_COLUMNS
        types: tuple[str, ...] = JOURNAL_TYPES
        rows = [_journal_row("C-1", 1000), _journal_row("NO-SUCH-LOG", 0)]
    else:
        columns, types = ("log_id", "level", "idx", "hash"), ("text", "int2", "int8", "bytea")
        rows = [("C-1", 30, 0, hashlib.sha256(b"a").digest()), ("NO-SUCH-LOG", 0, 0, b"\0" * 32)]
    with Session(engine) as s, pytest.raises((DBAPIError, psycopg.Error)) as exc:
        if path == "copy":
            copy_rows(s, table, columns, rows, types)
        else:
            names = ", ".join(columns)
            marks = ", ".join(f":{c}" for c in columns)
            s.execute(
                text(f"INSERT INTO {table} ({names}) VALUES ({marks})"),
                [dict(zip(columns, r, strict=True)) for r in rows],
            )
        s.commit()
    # COPY goes through the driver (a psycopg error), INSERT through SQLAlchemy (wrapped).
    error = getattr(exc.value, "orig", exc.value)
    assert isinstance(error, psycopg.Error) and error.sqlstate == "23503"
    assert f"insert into {table} refused: log_id 'NO-SUCH-LOG' is not a ledger log" in str(
        exc.value
    )
    assert _counts(engine) == before


def test_the_check_holds_for_the_owner_and_for_a_replica_session(
    engine, rebuild_engine, owner_engine
) -> None:
    """Not only the application role: the owner, and a superuser in replica mode (which
    skips foreign keys), are refused the same way."""
    _setup_contract(engine)
    before = _counts(engine)
    for eng, replica in ((rebuild_engine, False), (owner_engine, True)):
        with eng.begin() as c, pytest.raises(DBAPIError, match="is not a ledger log"):
            if replica:
                c.execute(text("SET session_replication_role = replica"))
            c.execute(
                text(
                    "INSERT INTO merkle_nodes (log_id, level, idx, hash) "
                    "VALUES ('NO-SUCH-LOG', 0, 0, '\\x00')"
                )
            )
    assert _counts(engine) == before


def test_a_log_is_never_deleted_renamed_or_truncated(engine, rebuild_engine, owner_engine) -> None:
    """What the foreign key refused on the referenced side, for the owner and a superuser."""
    _setup_contract(engine)
    for eng in (rebuild_engine, owner_engine):
        for sql in (
            "DELETE FROM ledger_logs",
            "UPDATE ledger_logs SET log_id = log_id || '-x'",
            "TRUNCATE ledger_logs CASCADE",
        ):
            with eng.begin() as c, pytest.raises(DBAPIError, match="ledger_logs is refused"):
                c.execute(text(sql))
    with engine.connect() as c:
        assert c.execute(text("SELECT log_id FROM ledger_logs")).scalars().all() == ["C-1"]
    # Advancing the size (what every append does) is still allowed.
    with rebuild_engine.begin() as c:
        c.execute(text("UPDATE ledger_logs SET size = size"))


def test_ingest_still_writes_through_the_checks(engine) -> None:
    """The ordinary path: a batch's entries and nodes pass the statement-level check."""
    _setup_contract(engine)
    width = 1 << tree.STORED_FROM
    records = [f.job_started()] + [
        f.rec("job_progress", at=f.later(k + 1), job_id="j1", step=k, step_seconds=1.0)
        for k in range(width - 2)
    ]
    recs, errors = parse_jsonl(f.jsonl(records))
    assert not errors
    with unit_of_work(engine) as s:
        assert ingest(s, recs).appended == width - 1
    # With the contract's entry, one full tile: its node, the first stored one.
    assert _counts(engine) == (width, 1)
