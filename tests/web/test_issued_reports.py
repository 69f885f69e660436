"""Issued reports in the portal and the API: the stored bytes, byte for byte, after any
number of new checkpoints; drafts marked as drafts; nothing of another tenant's.

On the seeded portal database (tests/web/conftest.py), C-A's March 2026 is issued
(reports.issued), the log signed; then more records and a newer checkpoint.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests import factories as fx
from tests.web.conftest import Seed


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def issued(seeded: tuple[Any, Seed]) -> dict[str, Any]:
    """C-A's 2026-03 issued and its entry signed; then a later record and a newer head."""
    from ledger.checkpoints import sign_all
    from ledger.ingest import ingest
    from ledger.records import validate_batch
    from reports import issued as ri
    from reports import monthly as rm
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        doc = ri.issue_month(s, "C-A", 2026, 3)
    with unit_of_work(ctx.engine) as s:
        sign_all(s, ctx.signer, ctx.settings.log_origin)
        [entry] = rm.issued_reports(s, "C-A", ["2026-03"])
    # Later: one more March failure, and a newer checkpoint over it.
    recs, errors = validate_batch([fx.rec("failure", "C-A", fx.T0 + timedelta(days=3),
                                          job_id="j1", failure_class="unplanned",
                                          cause="gpu_lost", node="node-9", gpu=1, step=5)])
    assert not errors
    with unit_of_work(ctx.engine) as s:
        ingest(s, recs, None, ctx.projectors)
    with unit_of_work(ctx.engine) as s:
        heads = {h.log_id: h.tree_size for h in sign_all(s, ctx.signer,
                                                          ctx.settings.log_origin)}
    return {"doc": doc, "entry": entry, "newest": heads["C-A"]}


def test_the_portal_serves_the_issued_bytes_after_a_new_checkpoint(
    client_for: Any, issued: dict[str, Any]
) -> None:
    doc, entry = issued["doc"], issued["entry"]
    alice = client_for("a")
    pdf = alice.get("/contracts/C-A/reports/2026-03.pdf", follow_redirects=False)
    assert pdf.status_code == 200 and pdf.content == doc.pdf
    assert sha(pdf.content) == entry["pdf_sha256"]
    assert pdf.headers["x-yoco-report"] == (
        f"issued; checkpoint={doc.checkpoint_size}; entry={doc.seq}; event-id={doc.event_id}")
    assert pdf.headers["repr-digest"] == (
        "sha-256=:" + base64.b64encode(hashlib.sha256(doc.pdf).digest()).decode() + ":")
    assert 'filename="yoco-sla-C-A-2026-03.pdf"' in pdf.headers["content-disposition"]
    html = alice.get("/contracts/C-A/reports/2026-03.html", follow_redirects=False)
    assert html.status_code == 200 and html.content == doc.html_bytes
    assert sha(html.content) == entry["html_sha256"]
    assert issued["newest"] > doc.checkpoint_size  # a newer head exists: still the issued

    # The list: status, checkpoint, entry and its proof (covered by a checkpoint now).
    page = alice.get("/contracts/C-A/reports").text
    assert "issued" in page and doc.pdf_sha256 in page and doc.html_sha256 in page
    proof_url = f"/contracts/C-A/entries/{doc.event_id}/proof"
    assert proof_url in page
    proof = alice.get(proof_url)
    assert proof.status_code == 200 and proof.json()["leaf_index"] == doc.seq

    # A draft over the newest checkpoint: marked, other bytes, recorded nowhere.
    draft = alice.get("/contracts/C-A/reports/2026-03.html?draft=1")
    assert draft.status_code == 200
    assert draft.headers["x-yoco-report"] == f"draft; checkpoint={issued['newest']}"
    assert f"DRAFT over checkpoint {issued['newest']}" in draft.text
    assert (f"was computed over checkpoint {doc.checkpoint_size} and is recorded in ledger "
            f"entry {doc.seq}") in draft.text
    assert sha(draft.content) != entry["html_sha256"]
    draft_pdf = alice.get("/contracts/C-A/reports/2026-03.pdf?draft=1")
    assert draft_pdf.status_code == 200 and draft_pdf.content.startswith(b"%PDF")
    assert draft_pdf.content != doc.pdf
    assert "-draft.pdf" in draft_pdf.headers["content-disposition"]

    # A month not issued yet goes to its draft, which says so.
    april = alice.get("/contracts/C-A/reports/2026-04.html", follow_redirects=False)
    assert april.status_code == 303 and april.headers["location"] == "2026-04.html?draft=1"
    april = alice.get("/contracts/C-A/reports/2026-04.html")
    assert "April 2026 has not been issued yet" in april.text
    assert april.headers["x-yoco-report"].startswith("draft; checkpoint=")


def test_the_api_lists_and_serves_issued_reports(
    client_for: Any, issued: dict[str, Any]
) -> None:
    doc, entry = issued["doc"], issued["entry"]
    alice = client_for("a")
    listed = alice.get("/api/v1/contracts/C-A/reports")
    assert listed.status_code == 200
    [item] = listed.json()
    assert item["month"] == "2026-03" and item["report"] == "monthly-sla"
    assert item["checkpoint_tree_size"] == entry["checkpoint_tree_size"] == doc.checkpoint_size
    assert item["checkpoint_root_hash"] == entry["checkpoint_root_hash"]
    assert item["event_id"] == entry["event_id"] and item["seq"] == doc.seq
    assert item["html_sha256"] == entry["html_sha256"]
    assert item["pdf_sha256"] == entry["pdf_sha256"]
    assert alice.get("/api/v1/contracts/C-A/reports",
                     headers={"If-None-Match": listed.headers["etag"]}).status_code == 304
    for kind in ("html", "pdf"):
        got = alice.get(item[kind])
        assert got.status_code == 200 and sha(got.content) == item[f"{kind}_sha256"]
        again = alice.get(item[kind], headers={"If-None-Match": got.headers["etag"]})
        assert again.status_code == 304
    assert alice.get(item["pdf"]).content == doc.pdf
    proof = alice.get(item["proof"])
    assert proof.status_code == 200 and proof.json()["leaf_index"] == doc.seq
    # Not issued: 404, never a draft.
    assert alice.get("/api/v1/contracts/C-A/reports/2026-04.pdf").status_code == 404
    assert alice.get("/api/v1/contracts/C-A/reports/2026-03.docx").status_code == 404
    assert alice.get("/api/v1/contracts/C-A2/reports").json() == []


def test_another_tenant_cannot_read_an_issued_report(
    client_for: Any, seeded: tuple[Any, Seed], issued: dict[str, Any], app: Any
) -> None:
    bob = client_for("b")
    for url in ("/contracts/C-A/reports/2026-03.pdf", "/contracts/C-A/reports/2026-03.html",
                "/contracts/C-A/reports", "/api/v1/contracts/C-A/reports",
                "/api/v1/contracts/C-A/reports/2026-03.pdf"):
        r = bob.get(url, follow_redirects=False)
        assert r.status_code == 404, url
        assert issued["doc"].pdf_sha256 not in r.text
    _, seed = seeded
    token = client_for()
    r = token.get("/api/v1/contracts/C-A/reports/2026-03.pdf",
                  headers={"Authorization": f"Bearer {seed.read_token_b}"})
    assert r.status_code == 404
    # The database alone: the portal role under row-level security.
    engine = app.state.portal.db.read_engine
    with engine.connect() as conn:
        def seen(customer: str, scope: str = "") -> list[str]:
            with conn.begin():
                conn.execute(text("SELECT set_config('yoco.customer', :c, true), "
                                  "set_config('yoco.scope', :s, true)"),
                             {"c": customer, "s": scope})
                return list(conn.execute(text(
                    "SELECT contract_id FROM issued_documents")).scalars())

        assert seen("Acme AI") == ["C-A"]
        assert seen("Bravo Labs") == []
        assert seen("") == []
        assert seen("", "all") == ["C-A"]
        for sql in ("UPDATE issued_documents SET pdf = html", "DELETE FROM issued_documents",
                    "TRUNCATE issued_documents"):
            with pytest.raises(DBAPIError) as info, conn.begin():
                conn.execute(text("SELECT set_config('yoco.scope', 'all', true)"))
                conn.execute(text(sql))
            assert info.value.orig.sqlstate == "42501", sql


def test_the_year_end_statement_is_served_as_issued(
    client_for: Any, seeded: tuple[Any, Seed]
) -> None:
    from datetime import UTC, datetime

    from billing.closing import close_year
    from reports import issued as ri
    from reports.statement import issue_year_statement
    from yoco.database import unit_of_work

    ctx, _ = seeded
    with unit_of_work(ctx.engine) as s:
        close_year(s, "C-A", 1, now=datetime(2027, 1, 5, tzinfo=UTC), signer=ctx.signer,
                   origin_prefix=ctx.settings.log_origin)
    with unit_of_work(ctx.engine) as s:
        st = issue_year_statement(s, "C-A", 1)
    assert st.created
    alice = client_for("a")
    page = alice.get("/contracts/C-A/reports").text
    assert "Year 1" in page and st.pdf_sha256 in page
    pdf = alice.get("/contracts/C-A/reports/year-1.pdf")
    assert pdf.status_code == 200 and pdf.content == st.pdf
    assert 'filename="yoco-statement-C-A-year-1.pdf"' in pdf.headers["content-disposition"]
    assert pdf.headers["x-yoco-report"].startswith(f"issued; checkpoint={st.checkpoint_size}")
    html = alice.get("/contracts/C-A/reports/year-1.html")
    assert html.content == st.html_bytes and "Year-end statement" in html.text
    # No drafts of statements; a year not closed has none.
    assert alice.get("/contracts/C-A/reports/year-1.html?draft=1").status_code == 404
    assert alice.get("/contracts/C-A/reports/year-2.pdf").status_code == 404
    items = alice.get("/api/v1/contracts/C-A/reports").json()
    [item] = [i for i in items if i["report"] == "year-statement"]
    assert item["year"] == 1 and item["month"] is None and item["period"] == "year-1"
    assert item["seq"] == st.seq and item["pdf_sha256"] == sha(st.pdf)
    assert alice.get(item["pdf"]).content == st.pdf
    again = ri.issue_due(lambda: unit_of_work(ctx.engine),
                         now=datetime(2027, 1, 6, tzinfo=UTC), contract_ids=["C-A"])
    assert all(r.month != "year-1" for r in again.results)  # issued once
    bob = client_for("b")
    assert bob.get("/contracts/C-A/reports/year-1.pdf").status_code == 404
    assert bob.get("/api/v1/contracts/C-A/reports/year-1.pdf").status_code == 404
