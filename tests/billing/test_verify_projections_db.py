"""`yoco ledger verify` covers what the figures come from: every projection, every table.

A DBA with superuser edits, deletes or adds a row in each projection table (the
tables ``yoco sla``, the reports and the portal compute figures from); verification
must fail naming the table, the row and (for an edit) the column.  And whatever a
figure reads is either the journal or one of those verified projections.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from billing.amendments import amend_contract
from billing.credits import apply_credit
from billing.disputes import open_dispute, reject_dispute, resolve_dispute
from billing.export import export_credits
from billing.projections import KINDS as BILLING_KINDS
from billing.projections import PROJECTORS, TABLES
from billing.services import credit_status, sla_figures, year_status
from ledger.errors import VerificationFailed
from ledger.models import APPEND_ONLY_TABLES, PROJECTION_TABLES
from ledger.projections import KINDS
from ledger.verify import verify_all
from tests import factories as f
from tests.billing.conftest import AFTER_Y1, Y1, add_contract, failures, ingest_records
from yoco.database import unit_of_work

LATER = AFTER_Y1 + timedelta(days=10)
EVERY = {"extra": PROJECTORS, "extra_tables": TABLES, "kinds": KINDS | BILLING_KINDS}


def _rich_ledger(engine: Engine, close: Any) -> None:
    """A ledger with rows in every projection table, ingested in many small batches."""
    add_contract(engine)
    add_contract(engine, "C-2", currency="JPY", annual_value="1000002")
    recs, ids = failures(resolved=8, unresolved=2)
    started = f.job_started(at=Y1 - timedelta(hours=1))
    finished = f.rec("job_finished", job_id="j1", step=10, at=Y1 + timedelta(days=2))
    excl = f.rec(
        "exclusion",
        failure_event_id=ids[1],
        reason="customer code",
        approved_by="ops",
        at=Y1 + timedelta(days=1),
    )
    ingest_records(engine, [started, *recs, excl, finished])
    ingest_records(engine, failures("C-2", unresolved=1)[0])
    ingest_records(engine, [f.job_started("j2", gpus=4, at=Y1 + timedelta(days=3))])
    with unit_of_work(engine) as s:
        amend_contract(
            s,
            "C-1",
            amendment_type="terms",
            effective_date=date(2026, 1, 1),
            changes={"terms": {"threshold_percent": "95"}},
            now=AFTER_Y1,
        )
    close()
    close("C-2")
    with unit_of_work(engine) as s:
        apply_credit(
            s,
            "CN-C-1-Y1",
            invoice_ref="INV-1",
            invoice_amount="100000.00",
            applied_on=date(2026, 2, 2),
            now=LATER,
        )
        d1 = open_dispute(s, "C-1", ids[-1], reason="not ours", now=LATER)
        d2 = open_dispute(s, "C-1", ids[0], reason="again", now=LATER)
    with unit_of_work(engine) as s:
        resolve_dispute(
            s,
            d1.dispute["dispute_id"],
            resolution="reclassification",
            decided_by="o",
            note="n",
            failure_class="planned",
            now=LATER,
        )
        reject_dispute(s, d2.dispute["dispute_id"], decided_by="o", note="n", now=LATER)
    # A late failure of year 1 for C-2: its year is marked as pending an adjustment.
    ingest_records(engine, failures("C-2", resolved=1, at=Y1 + timedelta(days=9))[0])
    with unit_of_work(engine) as s:
        export_credits(s, "csv", now=LATER)


@pytest.fixture
def rich(engine: Engine, close: Any) -> Engine:
    _rich_ledger(engine, close)
    return engine


def _verify(engine: Engine) -> Any:
    with Session(engine) as s:
        return verify_all(s, None, **EVERY)  # type: ignore[arg-type]


def test_every_projection_table_has_rows_and_verifies(rich: Engine) -> None:
    report = _verify(rich)
    assert report.projection_tables == len(PROJECTION_TABLES) + len(TABLES)
    with rich.connect() as c:
        empty = [
            t
            for t in (*PROJECTION_TABLES, *TABLES)
            if not c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
        ]
        total = sum(
            c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in (*PROJECTION_TABLES, *TABLES)
        )
    assert empty == []  # every table is exercised by the tampering tests below
    assert report.projection_rows == total
    # Verification leaves nothing behind: the same connection ingests into the real tables.
    with rich.connect() as c:
        temp = c.execute(
            text("SELECT count(*) FROM pg_class WHERE relpersistence = 't' AND relkind = 'r'")
        ).scalar_one()
    assert temp == 0


def test_verify_ignores_kinds_no_projector_reads_and_needs_every_kind_it_reads(
    rich: Engine,
) -> None:
    # With every kind replayed the result is the same as with the projected kinds only.
    with Session(rich) as s:
        verify_all(s, None, extra=PROJECTORS, extra_tables=TABLES, kinds=None)
    # Leaving out a kind a projector reads makes the replay differ: verify says so.
    with Session(rich) as s, pytest.raises(VerificationFailed, match="billing_disputes"):
        verify_all(
            s,
            None,
            extra=PROJECTORS,
            extra_tables=TABLES,
            kinds=(KINDS | BILLING_KINDS) - {"dispute_resolved", "dispute_rejected"},
        )


#: For every projection table: a column to edit (and its new value, SQL) and the patch
#: (jsonb) that gives a copied row a new primary key.
TAMPER: dict[str, tuple[str, str, str]] = {
    "contracts": ("customer", "'cust-evil'", '{"contract_id": "C-9"}'),
    "job_spans": ("gpus", "gpus + 1", '{"start_event_id": "%(uuid)s"}'),
    "failures": ("failure_class", "'planned'", '{"event_id": "%(uuid)s"}'),
    "outcomes": ("outcome", "'live_migrated'", '{"event_id": "%(uuid)s"}'),
    "exclusions": ("reason", "'whatever'", '{"event_id": "%(uuid)s"}'),
    "billing_years": ("guarantee_met", "NOT guarantee_met", '{"year": 7}'),
    # (unique: one first close and one live credit per contract year)
    "billing_closes": (
        "resolved_failures",
        "resolved_failures + 1",
        '{"event_id": "%(uuid)s", "kind": "adjustment"}',
    ),
    "billing_credits": (
        "amount_minor",
        "amount_minor - 1",
        '{"credit_id": "%(uuid)s", "status": "void", "credit_note": "CN-EVIL"}',
    ),
    "billing_credit_applications": (
        "remaining_minor",
        "remaining_minor + 100",
        '{"event_id": "%(uuid)s"}',
    ),
    "billing_disputes": ("status", "'open'", '{"dispute_id": "%(uuid)s"}'),
    "billing_reclassifications": (
        "failure_class",
        "'unplanned'",
        '{"event_id": "%(uuid)s"}',
    ),
    "billing_amendments": ("changes", "'{}'::jsonb", '{"event_id": "%(uuid)s"}'),
    "billing_exports": ("row_count", "row_count + 1", '{"event_id": "%(uuid)s"}'),
}


def test_the_tamper_table_names_every_projection_table() -> None:
    assert set(TAMPER) == {*PROJECTION_TABLES, *TABLES}


def _tamper(owner_engine: Engine, sql: str) -> int:
    """Run ``sql`` as the superuser, foreign keys and row triggers off (an attacker DBA)."""
    with owner_engine.begin() as c:
        c.execute(text("SET LOCAL session_replication_role = replica"))
        return c.execute(text(sql)).rowcount


def _one_row(table: str) -> str:
    # One row of the table; for outcomes, a rolled-back one (the edit makes it resolved).
    where = "WHERE outcome = 'rolled_back'" if table == "outcomes" else ""
    return f"(SELECT ctid FROM {table} {where} ORDER BY ctid LIMIT 1)"


@pytest.mark.parametrize("table", sorted(TAMPER))
@pytest.mark.parametrize("how", ["update", "delete", "insert"])
def test_verify_names_a_tampered_projection(
    rich: Engine, owner_engine: Engine, table: str, how: str
) -> None:
    import uuid

    column, value, patch = TAMPER[table]
    if how == "update":
        sql = f"UPDATE {table} SET {column} = {value} WHERE ctid = {_one_row(table)}"
    elif how == "delete":
        sql = f"DELETE FROM {table} WHERE ctid = {_one_row(table)}"
    else:
        patch = patch % {"uuid": uuid.uuid4()}
        sql = (
            f"INSERT INTO {table} SELECT (jsonb_populate_record(NULL::{table}, "
            f"to_jsonb(x) || '{patch}'::jsonb)).* FROM {table} x WHERE ctid = {_one_row(table)}"
        )
    assert _tamper(owner_engine, sql) == 1
    with pytest.raises(VerificationFailed) as exc:
        _verify(rich)
    assert exc.value.table == table
    message = str(exc.value)
    assert f"projection {table}: row (" in message
    if how == "update":
        assert exc.value.column == column and f"column {column}" in message
    elif how == "delete":
        assert "is missing" in message
    else:
        assert "is not in the journal" in message


def test_the_issue_s_edit_changes_sla_and_verify_exits_1_naming_it(
    rich: Engine, owner_engine: Engine, yoco_env: dict[str, str]
) -> None:
    from yoco.cli import build_app

    runner = CliRunner()
    with Session(rich) as s:
        before = sla_figures(s, "C-1", year=1).figures
    ok = runner.invoke(build_app(), ["ledger", "verify"])
    assert ok.exit_code == 0, ok.output
    assert "13 projection tables" in ok.output and "all match" in ok.output
    _tamper(owner_engine, "UPDATE outcomes SET outcome = 'live_migrated'")
    with Session(rich) as s:
        after = sla_figures(s, "C-1", year=1).figures
    assert after != before  # the edit moves a figure...
    bad = runner.invoke(build_app(), ["ledger", "verify"])
    assert bad.exit_code == 1, bad.output  # ...and verify catches it
    assert "projection outcomes" in bad.output and "column outcome" in bad.output
    assert "'live_migrated'" in bad.output and "'rolled_back'" in bad.output


def test_every_table_a_figure_reads_is_the_journal_or_a_verified_projection(
    rich: Engine,
) -> None:
    """The tables `yoco sla`, year and credit status read, seen by the server itself."""
    verified = {*APPEND_ONLY_TABLES, "ledger_logs", *PROJECTION_TABLES, *TABLES}
    now = datetime(2026, 6, 1, tzinfo=UTC)
    calls = {
        "sla year": lambda s: sla_figures(s, "C-1", year=1, now=now),
        "sla month": lambda s: sla_figures(s, "C-1", month=(2025, 3), now=now),
        "sla current": lambda s: sla_figures(s, "C-2", now=now),
        "year status": lambda s: year_status(s, "C-1", 1),
        "credit status": lambda s: credit_status(s, "C-1", 1),
    }
    for name, call in calls.items():
        with Session(rich) as s:
            call(s)
            # Scans in this transaction so far, per table (not yet flushed to the stats).
            read = set(
                s.execute(
                    text(
                        "SELECT relname FROM pg_stat_xact_user_tables "
                        "WHERE coalesce(seq_scan, 0) + coalesce(idx_scan, 0) > 0"
                    )
                ).scalars()
            )
            s.rollback()
        assert read, name
        assert read <= verified, f"{name} reads unverified tables {read - verified}"
