"""An issued month's evidence pack in the portal and the API: linked from the issued
reports page, the same bytes from both (those :mod:`reports.evidence` builds), nothing of
it for another tenant, and a month not issued is told so.

On the seeded portal database, C-A's March 2026 is issued and signed, then the log grows
and is signed again (``issued`` of tests/web/test_issued_reports.py).
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import pytest

from tests import factories as fx
from tests.web.conftest import Seed
from tests.web.test_issued_reports import issued

__all__ = ["issued"]

PORTAL = "/contracts/C-A/reports/2026-03/evidence.zip"
API = "/api/v1/contracts/C-A/reports/2026-03/evidence.zip"


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n.split("/", 1)[1]: zf.read(n) for n in zf.namelist()}


def test_the_customer_finds_and_downloads_the_pack_in_the_portal_and_the_api(
    client_for: Any, issued: dict[str, Any], seeded: tuple[Any, Seed]
) -> None:
    from reports.evidence import build_evidence_pack
    from yoco.database import unit_of_work

    doc = issued["doc"]
    alice = client_for("a")
    page = alice.get("/contracts/C-A/reports").text
    assert f'href="{PORTAL}"' in page and 'data-test="evidence-2026-03"' in page
    # Only issued months have one: April (not issued) has no link.
    assert "/reports/2026-04/evidence.zip" not in page
    assert "evidence pack" in alice.get("/verify").text  # the guide names it

    got = alice.get(PORTAL)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "application/zip"
    assert 'filename="yoco-evidence-C-A-2026-03.zip"' in got.headers["content-disposition"]
    assert got.headers["x-yoco-evidence"] == (
        f"issued-checkpoint={doc.checkpoint_size}; entry={doc.seq}; "
        f"log-checkpoint={issued['newest']}")
    files = _members(got.content)
    assert files["yoco-sla-C-A-2026-03.pdf"] == doc.pdf
    assert files["yoco-sla-C-A-2026-03.html"] == doc.html_bytes
    assert f"C-A-log-{issued['newest']}.tar.gz" in files
    assert b"yoco-verify C-A-log-" in files["README.txt"]

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        built = build_evidence_pack(s, "C-A", "2026-03")
    assert got.content == built.data  # one builder behind every surface

    listed = alice.get("/api/v1/contracts/C-A/reports").json()
    [item] = [i for i in listed if i["month"] == "2026-03"]
    assert item["evidence"] == API
    api = alice.get(API)
    assert api.status_code == 200 and api.content == built.data
    again = alice.get(API, headers={"If-None-Match": api.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_a_month_not_issued_has_no_pack_and_says_so(
    client_for: Any, issued: dict[str, Any]
) -> None:
    alice = client_for("a")
    page = alice.get("/contracts/C-A/reports/2026-04/evidence.zip")
    assert page.status_code == 404
    assert "has not been issued (yet): only an issued month has an evidence pack" in page.text
    api = alice.get("/api/v1/contracts/C-A/reports/2026-04/evidence.zip")
    assert api.status_code == 404
    assert "only an issued month has an evidence pack" in api.json()["detail"]
    for bad in ("year-1", "2026-13", "march"):
        assert alice.get(f"/contracts/C-A/reports/{bad}/evidence.zip").status_code == 404
        assert alice.get(f"/api/v1/contracts/C-A/reports/{bad}/evidence.zip"
                         ).status_code == 404


def test_another_tenant_cannot_download_the_pack(
    client_for: Any, issued: dict[str, Any], seeded: tuple[Any, Seed]
) -> None:
    _, seed = seeded
    bob = client_for("b")
    r = bob.get(PORTAL)
    assert r.status_code == 404 and b"PK" not in r.content[:2]
    assert "has not been issued" not in r.text  # not even whether it was issued
    assert bob.get(API).status_code == 404
    token = client_for()
    r = token.get(API, headers={"Authorization": f"Bearer {seed.read_token_b}"})
    assert r.status_code == 404 and issued["doc"].pdf_sha256 not in r.text
    assert token.get(API).status_code == 401
    # An ingest token (Acme's runtime) reads nothing, this neither.
    assert token.get(API, headers={"Authorization": f"Bearer {seed.token}"}
                     ).status_code == 403


# --------------------------------------------------------------------------- statements


@pytest.fixture
def statement(seeded: tuple[Any, Seed]) -> Any:
    """Acme's contract C-OLDA, whose year 1 (June 2024 to May 2025) is closed (missed)
    and its year-end statement issued, then the log signed over the statement's entry."""
    from datetime import timedelta

    from billing.closing import close_year
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from reports.statement import issue_year_statement
    from yoco.database import unit_of_work

    ctx, _ = seeded
    specs, errors = parse_contracts(json.dumps([fx.contract(
        "C-OLDA", customer="Acme AI", start_date="2024-06-01", term_years=2,
        annual_value="100000.00", currency="EUR")]).encode())
    assert not errors
    t0 = fx.T0.replace(year=2024, month=7)
    recs = [fx.rec("job_started", "C-OLDA", t0, job_id="j1", gpus=8)]
    for n, result in enumerate(["live_migrated", "rolled_back"]):
        at = t0 + timedelta(days=30 * n + 3)
        f = fx.rec("failure", "C-OLDA", at, job_id="j1", failure_class="unplanned",
                   cause="gpu_lost", node=f"node-{n}", gpu=n, step=1000 + 100 * n)
        recs += [f, fx.rec("outcome", "C-OLDA", at + timedelta(seconds=40),
                           failure_event_id=f["event_id"], outcome=result,
                           lost_steps=0 if result == "live_migrated" else 300,
                           recovery_seconds=30, step_seconds=1.5, gpus_affected=8)]
    records, errors = validate_batch(recs)
    assert not errors
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        ingest(s, records, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    with unit_of_work(ctx.engine) as s:
        close_year(s, "C-OLDA", 1, signer=ctx.signer, origin_prefix=ctx.settings.log_origin)
    with unit_of_work(ctx.engine) as s:
        doc = issue_year_statement(s, "C-OLDA", 1)
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    return doc


def test_an_issued_statements_pack_in_the_portal_and_the_api(
    client_for: Any, statement: Any, seeded: tuple[Any, Seed]
) -> None:
    from reports.evidence import build_evidence_pack
    from yoco.database import unit_of_work

    portal = "/contracts/C-OLDA/reports/year-1/evidence.zip"
    api = "/api/v1/contracts/C-OLDA/reports/year-1/evidence.zip"
    alice = client_for("a")
    page = alice.get("/contracts/C-OLDA/reports?year=1").text
    assert f'href="{portal}"' in page and 'data-test="evidence-year-1"' in page
    got = alice.get(portal)
    assert got.status_code == 200, got.text
    assert 'filename="yoco-evidence-C-OLDA-year-1.zip"' in got.headers["content-disposition"]
    files = _members(got.content)
    assert files["yoco-statement-C-OLDA-year-1.pdf"] == statement.pdf
    assert files["yoco-statement-C-OLDA-year-1.html"] == statement.html_bytes
    assert b"--report yoco-statement-C-OLDA-year-1.pdf" in files["README.txt"]
    ctx, seed = seeded
    with unit_of_work(ctx.engine) as s:
        built = build_evidence_pack(s, "C-OLDA", "year-1")
    assert got.content == built.data  # one builder behind every surface
    listed = alice.get("/api/v1/contracts/C-OLDA/reports").json()
    [item] = [i for i in listed if i["period"] == "year-1"]
    assert item["evidence"] == api
    assert alice.get(api).content == built.data

    # Year 2 is not closed, so not issued: told so; another tenant learns nothing.
    r = alice.get("/contracts/C-OLDA/reports/year-2/evidence.zip")
    assert r.status_code == 404
    assert "only an issued statement has an evidence pack" in r.text
    bob = client_for("b")
    r = bob.get(portal)
    assert r.status_code == 404 and "has not been issued" not in r.text
    token = client_for()
    r = token.get(api, headers={"Authorization": f"Bearer {seed.read_token_b}"})
    assert r.status_code == 404 and statement.pdf_sha256 not in r.text
