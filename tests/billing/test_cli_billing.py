"""``yoco billing …`` end to end on a real PostgreSQL (CliRunner on the full app)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests import factories as f
from tests.billing.conftest import failures
from yoco.cli import build_app

app = build_app()
runner = CliRunner()


def yoco(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


@pytest.fixture
def ledger(yoco_env, tmp_path: Path, engine) -> list[str]:
    """Two contracts from 2025-01-01; C-1 missed year 1 (8 of 9). Returns C-1's failure ids."""
    contracts = tmp_path / "contracts.json"
    contracts.write_text(
        json.dumps(
            [
                f.contract("C-1", start_date="2025-01-01"),
                f.contract("C-2", start_date="2025-01-01", currency="JPY", annual_value="1000002"),
            ]
        )
    )
    yoco("contracts", "import", str(contracts))
    recs, ids = failures(resolved=8, unresolved=1)
    recs2, _ = failures("C-2", resolved=1)
    data = tmp_path / "records.jsonl"
    data.write_bytes(f.jsonl(recs + recs2))
    yoco("ledger", "ingest", str(data))
    return ids


def _journal(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one()


def test_help_on_every_billing_command() -> None:
    assert "close-year" in yoco("billing", "--help")
    for cmd in ("close-year", "close-due", "status", "credits", "apply", "export", "amend"):
        assert "Usage" in yoco("billing", cmd, "--help")
    for cmd in ("open", "resolve", "reject", "list"):
        assert "Usage" in yoco("billing", "dispute", cmd, "--help")


def test_close_apply_export_and_verify(ledger, engine, tmp_path: Path) -> None:
    out = yoco("billing", "close-year", "C-1", "--year", "1")
    assert "guarantee missed" in out and "CN-C-1-Y1 250,000.00 USD" in out
    assert "already closed" in yoco("billing", "close-year", "C-1", "--year", "1")
    data = json.loads(yoco("billing", "close-due", "--json"))
    assert [(d["contract_id"], d["year"], d["action"]) for d in data] == [("C-2", 1, "closed")]
    status = json.loads(yoco("billing", "status", "C-1", "--year", "1", "--json"))
    assert status["credit"]["status"] == "issued" and status["close"]["closed"]
    sla = json.loads(yoco("sla", "C-1", "--year", "1", "--json"))
    assert sla["credit"]["credit_note"] == "CN-C-1-Y1" and sla["credit"]["amount"] == "250000.00"
    out = yoco(
        "billing",
        "apply",
        "CN-C-1-Y1",
        "--invoice",
        "INV-7",
        "--invoice-amount",
        "100000.00",
        "--date",
        "2026-02-01",
        "--kind",
        "expansion",
    )
    assert "remaining 150000.00 USD (partially_applied)" in out
    assert (
        json.loads(yoco("billing", "credits", "C-1", "--json"))[0]["status"] == "partially_applied"
    )
    files = []
    for fmt in ("csv", "xlsx", "json", "csv"):
        target = tmp_path / f"out-{len(files)}.{fmt}"
        assert "1 credit(s)" in yoco("billing", "export", "--format", fmt, "--out", str(target))
        files.append(target.read_bytes())
    assert files[0] == files[3]
    assert b"CN-C-1-Y1" in files[0]
    assert "all match" in yoco("ledger", "verify")


def test_disputes_through_the_cli(ledger, engine) -> None:
    yoco("billing", "close-year", "C-1", "--year", "1")
    out = yoco("billing", "dispute", "open", "C-1", ledger[-1], "--reason", "our OOM")
    did = out.split()[1]
    assert "open" in yoco("billing", "dispute", "list", "--contract", "C-1")
    yoco(
        "billing",
        "dispute",
        "resolve",
        did,
        "--by",
        "ops",
        "--note",
        "customer code",
        "--exclusion",
    )
    st = json.loads(yoco("billing", "status", "C-1", "--year", "1", "--json"))
    assert st["close"]["pending_adjustment"]
    out = yoco("billing", "close-year", "C-1", "--year", "1")
    assert "adjusted" in out and "voided" in out
    assert json.loads(yoco("billing", "dispute", "list", "--json"))[0]["status"] == "resolved"


@pytest.mark.parametrize(
    "args",
    [
        ("billing", "close-year", "C-404", "--year", "1"),
        ("billing", "close-year", "C-1", "--year", "0"),
        ("billing", "close-year", "C-1", "--year", "2"),
        (
            "billing",
            "apply",
            "CN-C-1-Y1",
            "--invoice",
            "I",
            "--invoice-amount",
            "-1",
            "--date",
            "2026-02-01",
        ),
        (
            "billing",
            "apply",
            "CN-C-1-Y1",
            "--invoice",
            "I",
            "--invoice-amount",
            "10",
            "--amount",
            "250000.01",
            "--date",
            "2026-02-01",
        ),
        (
            "billing",
            "apply",
            "CN-C-1-Y1",
            "--invoice",
            "I",
            "--invoice-amount",
            "10",
            "--date",
            "yesterday",
        ),
        ("billing", "export", "--format", "pdf", "--out", "x.pdf"),
        (
            "billing",
            "dispute",
            "open",
            "C-1",
            "0f6c6f7e-5a53-4c1b-9a3e-6b2f0d1c9e84",
            "--reason",
            "r",
        ),
        (
            "billing",
            "amend",
            "C-1",
            "--type",
            "renewal",
            "--effective",
            "2026-01-01",
            "--term-years",
            "1",
        ),
    ],
)
def test_refused_input_exits_2_and_writes_nothing(ledger, engine, args) -> None:
    yoco("billing", "close-year", "C-1", "--year", "1")
    before = _journal(engine)
    out = yoco(*args, code=2)
    assert "error" in out
    assert _journal(engine) == before


def test_dispute_list_neutralises_terminal_escapes_in_a_stored_reason(ledger) -> None:
    """A reason that clears the screen and draws a fake line, or reverses the text after
    it, is printed as visible escapes; --json keeps the reason exactly."""
    reason = "our OOM\x1b[2J\x1b[Hall disputes resolved\u202e [/]"
    yoco("billing", "dispute", "open", "C-1", ledger[-1], "--reason", reason)
    out = yoco("billing", "dispute", "list", "--contract", "C-1")
    assert "\x1b" not in out and "\u202e" not in out, repr(out)
    assert "our OOM\\u001b[2J\\u001b[Hall disputes resolved\\u202e [/]" in out, out
    rows = json.loads(yoco("billing", "dispute", "list", "--json"))
    assert rows[0]["reason"] == reason


def test_status_defaults_to_the_current_year_and_no_credit_says_so(ledger) -> None:
    from datetime import UTC, datetime

    from billing.services import current_year
    from ledger.contracts import get_contract
    from yoco.app import App
    from yoco.database import unit_of_work

    ctx = App()
    try:
        with unit_of_work(ctx.engine) as s:
            k = current_year(get_contract(s, "C-2"), datetime.now(UTC))
    finally:
        ctx.close()
    # like `yoco sla`, the current contract year when --year is left out
    status = json.loads(yoco("billing", "status", "C-2", "--json"))
    assert status["year"] == k
    assert f"C-2 year {k} (" in yoco("billing", "status", "C-2")
    # a contract with no credit says so instead of printing an empty table
    assert yoco("billing", "credits", "C-2").strip() == "C-2: no credit has been issued"
    assert json.loads(yoco("billing", "credits", "C-2", "--json")) == []
    assert "unknown contract" in yoco("billing", "credits", "C-NOPE", code=2)
