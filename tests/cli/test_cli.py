"""The ``yoco`` command line, end to end on a real PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import factories as f
from yoco.cli import build_app

app = build_app()

runner = CliRunner()


def yoco(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


@pytest.fixture
def contracts_file(tmp_path: Path) -> Path:
    p = tmp_path / "contracts.json"
    p.write_text(
        json.dumps(
            [
                f.contract("C-1", start_date="2026-01-01", timezone="America/New_York"),
                f.contract("C-2", currency="JPY", annual_value="120000000"),
            ]
        )
    )
    return p


def test_help_on_every_level() -> None:
    assert "ledger" in yoco("--help")
    for group in ("db", "contracts", "ledger"):
        assert "Usage" in yoco(group, "--help")
    for cmd in (
        ("ledger", "ingest"),
        ("ledger", "verify"),
        ("ledger", "prove"),
        ("sla",),
        ("contracts", "add"),
        ("verify-proof",),
        ("demo",),
    ):
        out = yoco(*cmd, "--help")
        assert "Usage" in out and len(out) > 200
        # a flag takes no value, so its help shows no type (Typer would write <bool>)
        assert "<bool>" not in out


def test_commands_refuse_an_unmigrated_database(yoco_env, tmp_path) -> None:
    yoco("db", "downgrade", "base", "--yes")
    out = runner.invoke(app, ["contracts", "list"])
    assert out.exit_code == 2 and "yoco db upgrade" in out.output
    yoco("db", "upgrade")
    yoco("contracts", "list")


def test_db_url_hides_nothing_it_should_not(yoco_env) -> None:
    out = yoco("db", "url")
    assert "postgresql+psycopg://" in out


def test_full_story_ingest_checkpoint_prove_verify_sla(yoco_env, contracts_file, tmp_path) -> None:
    yoco("contracts", "import", str(contracts_file))
    assert "already recorded" in yoco("contracts", "import", str(contracts_file))
    fail = f.failure(cid="C-1", at=f.later(1))
    records = [
        f.job_started(cid="C-1", gpus=16),
        fail,
        f.outcome(fail["event_id"], cid="C-1", at=f.later(2), gpus_affected=16),
        f.rec("job_finished", cid="C-1", job_id="j1", step=500, at=f.later(120)),
    ]
    path = tmp_path / "records.jsonl"
    path.write_bytes(f.jsonl(records))
    assert "4 appended" in yoco("ledger", "ingest", str(path))
    assert "0 appended" in yoco("ledger", "ingest", str(path))
    assert "signed: C-1 size 5" in yoco("ledger", "checkpoint")
    proof = tmp_path / "proof.json"
    yoco("ledger", "prove", fail["event_id"], "--out", str(proof))
    key = yoco("ledger", "public-key").strip()
    assert "proof verified" in yoco("verify-proof", str(proof), "--public-key", key)
    keyfile = tmp_path / "key.pub"
    keyfile.write_text(key + "\n")
    assert "proof verified" in yoco("verify-proof", str(proof), "--public-key", str(keyfile))
    # A forged proof (the entry changed) fails offline.
    bundle = json.loads(proof.read_text())
    import base64

    entry = base64.b64decode(bundle["entry"]).replace(b"gpu_lost", b"thermal")
    bundle["entry"] = base64.b64encode(entry).decode()
    proof.write_text(json.dumps(bundle))
    out = runner.invoke(app, ["verify-proof", str(proof), "--public-key", key])
    assert out.exit_code == 1 and "does not verify" in out.output
    assert "all match" in yoco("ledger", "verify")

    data = json.loads(yoco("sla", "C-1", "--year", "1", "--json"))
    for field in (
        "contract_id",
        "year",
        "period_start",
        "period_end",
        "covered_failures",
        "resolved_failures",
        "excluded_failures",
        "pending_failures",
        "resolution_rate",
        "guarantee_met",
        "allocated_gpu_hours",
        "lost_gpu_hours",
        "goodput",
        "credit",
    ):
        assert field in data
    assert data["covered_failures"] == 1 and data["resolved_failures"] == 1
    assert data["resolution_rate"] == "1.000000" and data["guarantee_met"] is True
    assert data["period_start"] == "2026-01-01T05:00:00+00:00"  # midnight in New York
    assert data["allocated_gpu_hours"] == "32.000000"  # 16 GPUs × 2 h
    assert data["lost_gpu_hours"] == "0.006667"  # 16 × 1.5 s
    month = json.loads(yoco("sla", "C-1", "--month", "2026-03", "--json"))
    assert month["covered_failures"] == 1 and month["month"] == "2026-03"
    table = yoco("sla", "C-1", "--year", "1")
    assert "resolution rate" in table and "100.00 % (1 of 1)" in table
    # The year to date as of an instant: the year containing it, from its start to it.
    ytd = json.loads(yoco("sla", "C-1", "--as-of", "2026-04-01", "--json"))
    assert ytd["year"] == 1 and ytd["period_end"] == "2026-04-01T04:00:00+00:00"
    assert ytd["as_of"] == ytd["computed_at"] == "2026-04-01T04:00:00+00:00"
    assert ytd["standing"] in ("on_track", "at_risk")  # the year is still running then
    assert "to date" in yoco("sla", "C-1", "--as-of", "2026-04-01T04:00:00+00:00")
    for bad, message in (("2026-04-01T04:00:00", "UTC offset"), ("April", "YYYY-MM-DD"),
                         ("2020-01-01", "not after")):
        r = runner.invoke(app, ["sla", "C-1", "--as-of", bad])
        assert r.exit_code == 2 and message in " ".join(r.output.split()), (bad, r.output)
    r = runner.invoke(app, ["sla", "C-1", "--year", "1", "--as-of", "2026-04-01"])
    assert r.exit_code == 2 and "one of --year, --month or --as-of" in r.output
    assert "projections rebuilt from 6" in yoco("ledger", "rebuild")


def test_ingest_refuses_bad_lines_and_writes_nothing(yoco_env, contracts_file, tmp_path) -> None:
    yoco("contracts", "import", str(contracts_file))
    good = f.job_started(cid="C-1")
    bad = f.rec("job_started", cid="C-1", job_id="j9", gpus=0)
    naive = dict(f.failure(cid="C-1"), occurred_at="2026-03-02T12:00:00")
    path = tmp_path / "bad.jsonl"
    path.write_bytes(f.jsonl([good, bad, naive]) + b'{"kind": "nope"}\n')
    result = runner.invoke(app, ["ledger", "ingest", str(path)])
    assert result.exit_code == 2
    assert "line 2" in result.output and "gpus" in result.output
    assert "line 3" in result.output and "occurred_at" in result.output
    assert "line 4" in result.output and "nothing written" in result.output
    assert "projections rebuilt from 2" in yoco("ledger", "rebuild")


def test_sla_errors_are_clear(yoco_env, contracts_file) -> None:
    yoco("contracts", "import", str(contracts_file))
    out = runner.invoke(app, ["sla", "NOPE"])
    assert out.exit_code == 2 and "unknown contract" in out.output
    out = runner.invoke(app, ["sla", "C-1", "--year", "3"])
    assert out.exit_code == 2 and "years 1 to 2" in out.output
    out = runner.invoke(app, ["sla", "C-1", "--month", "2026-13"])
    assert out.exit_code == 2 and "YYYY-MM" in out.output
    out = runner.invoke(app, ["sla", "C-1", "--month", "2030-01"])
    assert out.exit_code == 2 and "outside" in out.output


def test_contracts_add_validates_every_field(yoco_env) -> None:
    out = runner.invoke(
        app,
        [
            "contracts",
            "add",
            "--id",
            "X",
            "--customer",
            "c",
            "--start",
            "2026-02-30",
            "--currency",
            "usd",
            "--annual-value",
            "1.5e3",
        ],
    )
    assert out.exit_code == 2
    assert "start_date" in out.output and "currency" in out.output
    assert "annual_value" in out.output
    yoco(
        "contracts",
        "add",
        "--id",
        "X",
        "--customer",
        "c",
        "--start",
        "2026-02-28",
        "--currency",
        "EUR",
        "--annual-value",
        "1000.00",
        "--threshold-percent",
        "95",
    )
    assert "X" in yoco("contracts", "list")


def test_prove_refuses_unknown_and_unsigned(yoco_env, contracts_file, tmp_path) -> None:
    yoco("contracts", "import", str(contracts_file))
    out = runner.invoke(app, ["ledger", "prove", "00000000-0000-4000-8000-000000000000"])
    assert out.exit_code == 2 and "no ledger entry" in out.output
    fail = f.failure(cid="C-2")
    p = tmp_path / "r.jsonl"
    p.write_bytes(f.jsonl([fail]))
    yoco("ledger", "ingest", str(p))
    out = runner.invoke(app, ["ledger", "prove", fail["event_id"]])
    assert out.exit_code == 2 and "yoco ledger checkpoint" in out.output


@pytest.mark.slow
def test_demo_tells_the_whole_story_with_a_real_training_job(yoco_env, engine) -> None:
    # The README's main command, small: a simulated stream plus a real job under the
    # runtime with every kind of event, recorded in the ledger and read back from it;
    # ended years closed with their credits, reports, the export, a proof, portal logins.
    from sqlalchemy import text

    out = yoco("demo", "--contracts", "2", "--records", "300")
    for label in ("1. REAL", "2. SAMPLE", "3. SIMULATED", "4. REAL", "6. REAL", "8. REAL",
                  "9. REAL", "10. REAL", "11. REAL"):
        assert label in out, (label, out)
    events = [ln.split(":", 1)[1].split() for ln in out.splitlines()
              if ln.strip().startswith("step ") and "→" in ln]
    assert [(e[0], e[1], e[3]) for e in events] == [
        ("unplanned", "process_killed", "live_migrated"),
        ("preemptive", "ecc_rising", "live_migrated"),
        ("planned", "maintenance", "live_migrated"),
        ("unplanned", "process_killed", "rolled_back"),
    ], out
    lost = [ln.split("lost steps ")[1].split(",")[0] for ln in out.splitlines()
            if "→" in ln and "lost steps" in ln]
    assert lost == ["0", "0", "0", "6"], out
    assert "finished at step 44" in out and "every record delivered to the ledger" in out

    def ledger_state() -> tuple[int, list[tuple[str, int, str, int]], int]:
        with engine.connect() as c:
            entries = c.execute(text("SELECT count(*) FROM journal_entries")).scalar_one()
            credits = [tuple(r) for r in c.execute(text(
                "SELECT contract_id, year, credit_note, amount_minor FROM billing_credits "
                "ORDER BY 1, 2"))]
            closed = c.execute(text("SELECT count(*) FROM billing_years")).scalar_one()
        return entries, credits, closed

    from datetime import UTC, date, datetime

    from billing.years import contract_year_bounds

    entries, credits, closed = ledger_state()
    # Every ended year is closed (on 2026-11-30: ACME's 2025, BRAVO's first two years);
    # BRAVO's 95 % threshold is missed by the simulated ~91 %, so its years carry credits.
    now = datetime.now(UTC)
    ended = [
        (cid, k)
        for cid, start, tz, term in (("ACME-2025-001", date(2025, 1, 1), "America/New_York", 3),
                                     ("BRAVO-2024-007", date(2024, 2, 29), "Europe/Berlin", 3))
        for k in range(1, term + 1)
        if contract_year_bounds(start, tz, k)[1] <= now
    ]
    assert closed == len(ended) >= 3, out
    assert {(c[0], c[1]) for c in credits} >= {("BRAVO-2024-007", 1), ("BRAVO-2024-007", 2)}
    assert {(c[0], c[1]) for c in credits} <= set(ended)
    for cid, year, note, _ in credits:
        assert f"credit {note} of" in out and f"{cid} year {year}: closed" in out
    demo = Path(yoco_env["YOCO_DATA_DIR"]) / "demo"
    reports = sorted(p.name for p in (demo / "reports").iterdir())
    assert len(reports) == 4 and {p.rsplit(".", 1)[1] for p in reports} == {"html", "pdf"}
    for name in reports:
        assert str(demo / "reports" / name.rsplit(".", 1)[0]) in out
        if name.endswith(".pdf"):
            assert (demo / "reports" / name).read_bytes().startswith(b"%PDF")
    export = (demo / "finance-export.csv").read_text()
    assert all(note in export for _, _, note, _ in credits), export
    assert str(demo / "finance-export.csv") in out
    assert "yoco verify-proof" in out and (demo / "proof.json").is_file()
    assert "yoco serve" in out and "customer@acme.example" in out
    logins = json.loads((demo / "logins.json").read_text())
    assert logins["customer@acme.example"] in out

    def figures(text_out: str) -> list[str]:
        start = text_out.index("7. REAL")
        return text_out[start : text_out.index("8. REAL")].splitlines()[1:]

    # A second run on the same data folder changes nothing: no record, close, credit,
    # report or export is written twice, and every figure reads the same.
    again = yoco("demo", "--contracts", "2", "--records", "300")
    assert ledger_state() == (entries, credits, closed), again
    assert "0 appended" in again and "nothing to close" in again
    assert "already in the ledger: job" in again
    assert figures(again) == figures(out)



def test_no_help_text_shows_literal_markup(monkeypatch) -> None:
    # Every command's --help is read by people: no reST/Markdown backticks, no rich tags.
    import typer as _typer

    def walk(cmd, path):
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])
        yield path

    # The command tree built once: typer's runner would rebuild it (every parameter's
    # annotations evaluated again) for each of the helps.
    import typer.testing

    command = _typer.main.get_command(app)
    monkeypatch.setattr(typer.testing, "_get_command", lambda _app: command)
    seen = 0
    for path in walk(command, []):
        text = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        assert "Usage" in text, path
        bad = [ln.strip() for ln in text.splitlines() if "`" in ln or "[/" in ln or "[bold" in ln]
        assert not bad, (path, bad)
        seen += 1
    assert seen > 30


def test_tables_are_whole_and_numbers_grouped_when_piped(yoco_env, tmp_path) -> None:
    # CliRunner's output is not a terminal (as in a pipe): nothing may be cut at 80 columns.
    long_id = "CN-BRAVO-2024-007-RESEARCH-CLUSTER-EUROPE-WEST"
    p = tmp_path / "c.json"
    p.write_text(json.dumps([f.contract(long_id, customer="Bravo Research GmbH, Munich office",
                                        annual_value="4200000.00", timezone="Europe/Berlin")]))
    yoco("contracts", "import", str(p))
    out = yoco("contracts", "list")
    assert long_id in out and "4,200,000.00" in out and "…" not in out, out


def test_out_dash_is_standard_output(yoco_env, contracts_file, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    yoco("contracts", "import", str(contracts_file))
    fail = f.failure(cid="C-1", at=f.later(1))
    path = tmp_path / "records.jsonl"
    path.write_bytes(f.jsonl([f.job_started(cid="C-1", gpus=8), fail]))
    yoco("ledger", "ingest", str(path))
    yoco("ledger", "checkpoint")
    proof = json.loads(yoco("ledger", "prove", fail["event_id"], "--out", "-"))
    assert proof["tree_size"] >= 2
    export = runner.invoke(app, ["billing", "export", "--format", "csv", "--out", "-"])
    assert export.exit_code == 0, export.output
    assert export.stdout.startswith("credit_id,") or "credit" in export.stdout.splitlines()[0]
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("url", ["notaurl", "mysql://root@db/yoco"])
def test_a_malformed_database_url_is_bad_input_not_a_traceback(monkeypatch, url) -> None:
    from yoco.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        out = runner.invoke(app, ["contracts", "list"])
    finally:
        get_settings.cache_clear()
    # 2 is bad input; 1 is reserved for a failed verification (README)
    assert out.exit_code == 2, out.output
    assert "DATABASE_URL must be a PostgreSQL URL" in out.output
    assert "Traceback" not in out.output and "pydantic" not in out.output


def test_an_unreachable_server_is_called_unreachable(monkeypatch) -> None:
    import socket

    from yoco.settings import get_settings

    with socket.socket() as s:  # a port nobody listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DATABASE_URL", f"postgresql+psycopg://yoco_cli:pw@127.0.0.1:{port}/yoco")
    get_settings.cache_clear()
    try:
        out = runner.invoke(app, ["contracts", "list"])
    finally:
        get_settings.cache_clear()
    assert out.exit_code == 2, out.output
    assert f"cannot connect to the database at 127.0.0.1:{port}/yoco" in out.output
    assert "yoco db upgrade" not in out.output and "pw" not in out.output
