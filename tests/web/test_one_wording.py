"""One contract year on every surface: the same words for the same fact.

A contract starting 2024-02-29 (its first year's last day is 2025-02-27: the anniversary
is 2025-02-28) with a pre-emptive ``ecc_rising`` failure and unplanned ``gpu_lost`` ones;
year 1 missed and closed.  The portal (failures list, failure page, credits page), the
monthly report, the finance export (CSV) and the command line (``billing status``,
``billing credits``, ``contracts list``) must all write its class, cause, period, state
and verdict with billing.labels' and billing.yearend's words — and none the raw code.
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests import factories as fx
from tests.web.conftest import login
from yoco.cli import build_app

CID = "C-LEAP"
#: The words every surface writes for the first year's span (last day included).
PERIOD = "2024-02-29 to 2025-02-27"


def _yoco(*args: str) -> str:
    result = CliRunner().invoke(build_app(), list(args), catch_exceptions=False)
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result.output


def _text(html: str) -> str:
    """The visible text of a page, one space between words."""
    html = re.sub(r"(?is)<(script|style|title)\b.*?</\1>", " ", html)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.fixture
def leap(seeded: tuple[Any, Any]) -> tuple[Any, Any, list[str]]:
    """Bravo Labs' contract from 2024-02-29 (Berlin), year 1 missed (1 of 3) and closed."""
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from yoco.database import unit_of_work

    ctx, seed = seeded
    specs, errors = parse_contracts(json.dumps([fx.contract(
        CID, customer="Bravo Labs", start_date="2024-02-29", term_years=3,
        timezone="Europe/Berlin", annual_value="1050000.00", currency="EUR")]).encode())
    assert not errors
    t0 = fx.T0.replace(year=2024, month=7)
    recs = [fx.rec("job_started", CID, t0, job_id="j1", gpus=64)]
    fids = []
    plan = [("preemptive", "ecc_rising", "live_migrated"), ("unplanned", "gpu_lost", "rolled_back"),
            ("unplanned", "gpu_lost", "rolled_back")]
    for n, (cls, cause, result) in enumerate(plan):
        at = t0 + timedelta(days=3 + n)
        f = fx.rec("failure", CID, at, job_id="j1", failure_class=cls, cause=cause,
                   node=f"node-{n}", gpu=n, step=1000 + 100 * n)
        recs.append(f)
        fids.append(f["event_id"])
        recs.append(fx.rec("outcome", CID, at + timedelta(seconds=40),
                           failure_event_id=f["event_id"], outcome=result,
                           lost_steps=0 if result == "live_migrated" else 300,
                           recovery_seconds=2.5, step_seconds=1.5, gpus_affected=8))
    records, errors = validate_batch(recs)
    assert not errors
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        ingest(s, records, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    _yoco("billing", "close-year", CID, "--year", "1")
    return ctx, seed, fids


def test_every_surface_writes_the_year_and_the_failures_alike(
    leap, client_for, tmp_path: Path
) -> None:
    ctx, seed, fids = leap
    bob = client_for()
    assert login(bob, seed.users["b"]).status_code == 303

    # --- class and cause: billing.labels' words, never the code -----------------------
    failures = _text(bob.get(f"/contracts/{CID}/failures?year=1").text)
    detail = _text(bob.get(f"/contracts/{CID}/failures/{fids[0]}").text)
    from reports.monthly import prepare_monthly_report
    from yoco.database import unit_of_work

    with unit_of_work(ctx.engine) as s:
        report = _text(prepare_monthly_report(s, CID, 2024, 7).html)
    contracts = _yoco("contracts", "list")
    for name, text in (("failures page", failures), ("failure page", detail),
                       ("report", report)):
        assert "pre-emptive" in text.lower(), name
        assert "ECC rising" in text, name
        assert not re.search(r"\b(preemptive|ecc_rising|gpu_lost|ecc rising|gpu lost)\b",
                             text), (name, text)
    assert "GPU lost" in failures and "GPU lost" in report
    assert "Pre-emptive failure: ECC rising" in detail
    # The contract's terms read alike in the report and on the command line.
    assert "Covered failure classes unplanned, pre-emptive" in report
    assert "Excluded causes customer code, facility power, network wide outage" in report
    row = next(line for line in contracts.splitlines() if CID in line)
    assert "unplanned, pre-emptive" in " ".join(contracts.split())
    assert "preemptive" not in contracts and "network_wide_outage" not in contracts
    assert "3 of 3" in row or "3 of 3" in contracts  # its current year, of the term

    # --- year end: the period's last day, the state and the verdict -------------------
    credits = _text(bob.get(f"/contracts/{CID}/credits").text)
    assert f"Year 1 {PERIOD} closed guarantee missed" in credits
    assert "Year 2 2025-02-28 to 2026-02-27 ended, closing" in credits
    assert "2025-02-28 –" not in credits  # the exclusive end, unsaid, is gone

    status = " ".join(_yoco("billing", "status", CID, "--year", "1").split())
    assert f"{CID} year 1 ({PERIOD}, Europe/Berlin): closed at" in status
    assert "guarantee missed" in status
    status2 = " ".join(_yoco("billing", "status", CID, "--year", "2").split())
    assert f"{CID} year 2 (2025-02-28 to 2026-02-27, Europe/Berlin): ended, closing" in status2
    credits_cli = " ".join(_yoco("billing", "credits", CID).split())
    assert PERIOD in credits_cli

    out = tmp_path / "credits.csv"
    _yoco("billing", "export", "--format", "csv", "--out", str(out), "--contract", CID)
    (exported,) = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert f"{exported['period_start']} to {exported['period_end']}" == PERIOD
