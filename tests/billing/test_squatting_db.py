"""Squatted and probed event ids, on a real PostgreSQL.

Before: ingest took any UUID, and billing's and contracts' entries have deterministic
UUIDv5 ids, so tenant A could store a record under tenant B's *future* year-close id:
B's close-year (and contracts add, credits) then failed for ever with a unique
violation; and "already in the ledger with different content (log 'C-B', seq 9)"
told A what B's log holds. Now producers' ids must be random UUID v4, every id the
system derives is v5 (or v8 when random), and a collision names nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from billing import entries
from billing.amendments import amend_contract
from billing.credits import apply_credit
from billing.export import export_credits
from ledger.contracts import add_contracts, contract_event_id
from ledger.ids import is_producer_event_id, random_internal_id
from ledger.records import parse_contracts
from reports.monthly import report_event_id
from tests import factories as f
from tests.billing.conftest import AFTER_Y1, Y1, add_contract, failures, ingest_records
from yoco.cli import build_app
from yoco.database import unit_of_work

runner = CliRunner()
app = build_app()


def _journal_size(engine: Any) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one())


def _ingest_file(tmp_path: Path, records: list[dict[str, Any]]) -> Any:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(f.jsonl(records))
    return runner.invoke(app, ["ledger", "ingest", str(path)])


def _squat(eid: uuid.UUID | str, cid: str = "C-A") -> dict[str, Any]:
    """Tenant A's record under someone else's id (a job_started of A's own contract)."""
    return f.rec("job_started", cid, Y1, job_id="squat", gpus=8, event_id=eid)


def test_every_id_the_system_derives_is_outside_the_producers_space() -> None:
    credit_id = entries.event_id("credit", "C-B", 1, 1)
    derived = {
        "contract": contract_event_id("C-B"),
        "year_close": entries.event_id("year_close", "C-B", 1),
        "adjustment": entries.event_id("adjustment", "C-B", 1, 1),
        "credit": credit_id,
        "credit_void": entries.event_id("credit_void", credit_id),
        "credit_application": entries.event_id("credit_application", credit_id, "INV-1"),
        "amendment": entries.event_id("amendment", "C-B", "AM-1"),
        "dispute": random_internal_id(),
        "dispute_decision": entries.event_id("dispute_decision", random_internal_id()),
        "dispute_exclusion": entries.event_id("dispute_exclusion", random_internal_id()),
        "dispute_reclassification": entries.event_id(
            "dispute_reclassification", random_internal_id()
        ),
        "export": entries.event_id("export", "batch", "csv", "00" * 32),
        "report": report_event_id(
            SimpleNamespace(  # type: ignore[arg-type]
                contract_id="C-B",
                month_label="2026-02",
                checkpoint_size=9,
                html_sha256="ab" * 32,
                pdf_sha256="cd" * 32,
            )
        ),
    }
    for kind, eid in derived.items():
        assert eid.version in (5, 8), kind
        assert not is_producer_event_id(eid), kind
    # And two random internal ids never repeat.
    assert random_internal_id() != random_internal_id()


def test_an_internal_entry_refuses_a_v4_id() -> None:
    with pytest.raises(ValueError, match="UUID v4"):
        entries.make_entry("year_close", uuid.uuid4(), "C-B", AFTER_Y1, {})


def test_squatting_every_derived_id_is_refused_and_the_real_entries_then_succeed(
    engine, yoco_env, close, tmp_path
) -> None:
    add_contract(engine, "C-A", customer="Acme")
    add_contract(engine, "C-B", customer="Bravo")
    ingest_records(engine, failures("C-B", resolved=1, unresolved=1)[0])

    credit_id = entries.event_id("credit", "C-B", 1, 1)
    targets = {
        "year_close": entries.event_id("year_close", "C-B", 1),
        "adjustment": entries.event_id("adjustment", "C-B", 1, 1),
        "credit": credit_id,
        "credit_void": entries.event_id("credit_void", credit_id),
        "credit_application": entries.event_id("credit_application", credit_id, "INV-1"),
        "amendment": entries.event_id("amendment", "C-B", "AM-1"),
        "contract": contract_event_id("C-NEW"),
    }
    before = _journal_size(engine)
    for kind, eid in targets.items():
        out = _ingest_file(tmp_path, [_squat(eid)])
        assert out.exit_code == 2, (kind, out.output)
        assert "line 1" in out.output and "event_id" in out.output, out.output
        assert "random UUID v4" in out.output, out.output
    # All of them in one file: each refused by its own line.
    out = _ingest_file(tmp_path, [_squat(eid) for eid in targets.values()])
    assert out.exit_code == 2
    assert all(f"line {n}" in out.output for n in range(1, len(targets) + 1)), out.output
    assert _journal_size(engine) == before

    # B's year closes with its credit; a new contract is added; B amends; finance
    # applies the credit and exports: every one of them writes its derived id.
    result = close("C-B")
    assert result.action == "closed" and result.credit_issued
    assert result.event_id == str(targets["year_close"])
    assert result.credit["credit_id"] == str(credit_id)
    specs, errors = parse_contracts(f.jsonl([f.contract("C-NEW", start_date="2026-01-01")]))
    assert not errors
    with unit_of_work(engine) as s:
        assert add_contracts(s, specs).created == ["C-NEW"]
    with unit_of_work(engine) as s:
        amended = amend_contract(
            s,
            "C-B",
            amendment_type="expansion",
            effective_date=date(2026, 6, 1),
            changes={"renewal_value": "2000000.00"},
            amendment_id="AM-1",
            now=datetime(2026, 2, 2, tzinfo=UTC),
        )
    assert amended.created and amended.event_id == str(targets["amendment"])
    with unit_of_work(engine) as s:
        applied = apply_credit(
            s,
            str(credit_id),
            invoice_ref="INV-1",
            invoice_amount="900000.00",
            applied_on=date(2026, 2, 10),
            now=datetime(2026, 2, 10, tzinfo=UTC),
        )
    assert applied.event_id == str(targets["credit_application"])
    with unit_of_work(engine) as s:
        preview = export_credits(s, "csv", record=False, now=datetime.now(UTC))
    export_id = entries.event_id("export", preview.batch_id, "csv", preview.sha256)
    out = _ingest_file(tmp_path, [_squat(export_id)])
    assert out.exit_code == 2 and "random UUID v4" in out.output
    with unit_of_work(engine) as s:
        exported = export_credits(s, "csv", now=datetime.now(UTC))
    assert exported.recorded and exported.event_id == str(export_id)


@pytest.mark.parametrize("version", [1, 3, 5, 6, 7, 8])
def test_ingest_refuses_every_uuid_version_but_4(engine, yoco_env, tmp_path, version) -> None:
    add_contract(engine, "C-A")
    eid = uuid.UUID(int=uuid.uuid4().int)
    n = (eid.int & ~(0xF << 76)) | (version << 76)
    out = _ingest_file(tmp_path, [_squat(uuid.UUID(int=n))])
    assert out.exit_code == 2 and "random UUID v4" in out.output
    # Variant bits other than RFC 9562's are refused too, even with version digit 4.
    odd = uuid.UUID(int=(uuid.uuid4().int & ~(0x3 << 62)) | (0x3 << 62))
    assert odd.version is None
    out = _ingest_file(tmp_path, [_squat(odd)])
    assert out.exit_code == 2 and "random UUID v4" in out.output


# --------------------------------------------------------------------- item 2: no oracle


def _refusal_for(tmp_path: Path, eid: str, cid: str = "C-A") -> str:
    out = _ingest_file(tmp_path, [_squat(eid, cid)])
    assert out.exit_code == 2, out.output
    return out.output.replace(str(eid), "<ID>").replace(str(tmp_path), "<DIR>")


def test_the_cli_says_the_same_of_an_id_in_another_log_as_of_one_in_its_own(
    engine, yoco_env, close, tmp_path
) -> None:
    add_contract(engine, "C-A")
    add_contract(engine, "C-B")
    mine, _ = failures("C-A", resolved=1)
    theirs, _ = failures("C-B", resolved=1)
    ingest_records(engine, mine + theirs)
    close("C-B")  # B's year 1 closed (met): its close id exists
    own = _refusal_for(tmp_path, mine[0]["event_id"])
    other = _refusal_for(tmp_path, theirs[0]["event_id"])
    assert own == other
    assert "C-B" not in other and "seq" not in other and "failure" not in other
    # B's closed and never-closed years answer alike: the derived ids cannot be asked.
    closed = _refusal_for(tmp_path, str(entries.event_id("year_close", "C-B", 1)))
    never = _refusal_for(tmp_path, str(entries.event_id("year_close", "C-B", 2)))
    credit = _refusal_for(tmp_path, str(entries.event_id("credit", "C-B", 1, 1)))
    assert closed == never == credit
    assert "C-B" not in closed
