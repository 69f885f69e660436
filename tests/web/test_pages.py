"""The customer's pages and the staff's pages, through FastAPI's TestClient."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from ledger.proofs import verify_bundle
from tests.web.conftest import csrf_of


def test_dashboard_shows_verdict_counts_and_chart(client_for, seed) -> None:
    alice = client_for("a")
    r = alice.get("/contracts", follow_redirects=False)
    assert r.status_code == 200 and "C-A2" in r.text  # two contracts: a list
    r = alice.get("/contracts/C-A")
    assert r.status_code == 200
    html = r.text
    # Seed: covered = gpu_lost (resolved), ecc (rolled back), thermal (resolved),
    # kernel_panic (pending); planned is not covered, network_wide_outage is excluded.
    assert "50.00 %" in html and "Below the guarantee so far" in html
    assert "<svg" in html and 'class="bar miss"' in html and "guaranteed 90 %" in html
    assert "Lost GPU-hours" in html and "USD" in html  # gpu_hour_price gives a cost


def test_failures_list_filters_and_paginates(client_for) -> None:
    alice = client_for("a")
    base = "/contracts/C-A/failures"
    assert "6 failures in year 1" in alice.get(base).text
    assert "1 failure matches" in alice.get(base, params={"status": "pending"}).text
    assert "1 failure matches" in alice.get(base, params={"failure_class": "planned"}).text
    assert "1 failure matches" in alice.get(base, params={"cause": "thermal"}).text
    r = alice.get(base, params={"month": "2026-03"})
    assert "2 failures match" in r.text  # 03-03 and 03-23
    page1 = alice.get("/api/v1/contracts/C-A/failures", params={"per_page": 4}).json()
    page2 = alice.get("/api/v1/contracts/C-A/failures",
                      params={"per_page": 4, "page": 2}).json()
    assert (page1["total"], page1["pages"], len(page1["items"]), len(page2["items"])) == (
        6, 2, 4, 2)
    ids = [i["event_id"] for i in page1["items"] + page2["items"]]
    assert len(set(ids)) == 6
    times = [i["occurred_at"] for i in page1["items"] + page2["items"]]
    assert times == sorted(times, reverse=True)
    html = alice.get(base, params={"per_page": 4}).text
    assert "Page 1 of 2" in html and "Older" in html


def test_failure_detail_and_its_proofs_verify_offline(client_for, seed) -> None:
    alice = client_for("a")
    fid = seed.failures["C-A"][1]  # rolled back
    r = alice.get(f"/contracts/C-A/failures/{fid}")
    assert r.status_code == 200
    assert "rolled back" in r.text and "Timeline" in r.text
    # The seeded dispute is open: no second form until it is decided.
    assert "A dispute of this failure is open" in r.text and "Open a dispute" not in r.text
    assert "Open a dispute" in alice.get(f"/contracts/C-A/failures/{seed.failures['C-A'][0]}").text
    assert "we lost more steps" in r.text  # the seeded dispute
    key = alice.get("/public-key").text.strip()
    proof = alice.get(f"/contracts/C-A/entries/{fid}/proof")
    assert proof.headers["content-disposition"].startswith("attachment")
    verified = verify_bundle(json.loads(proof.content), key)
    assert str(verified)
    api_proof = alice.get(f"/api/v1/contracts/C-A/entries/{seed.outcomes['C-A'][1]}/proof")
    verify_bundle(api_proof.json(), key)


def test_checkpoints_and_consistency_proof(client_for, seed) -> None:
    alice = client_for("a")
    r = alice.get("/contracts/C-A/checkpoints")
    assert r.status_code == 200 and "Consistency proof" in r.text
    heads = alice.get("/api/v1/contracts/C-A/checkpoints").json()
    assert len(heads) == 2
    sizes = sorted(h["tree_size"] for h in heads)
    key = alice.get("/api/v1/public-key").text.strip()
    r = alice.get("/contracts/C-A/checkpoints/consistency",
                  params={"size1": sizes[0], "size2": sizes[1]})
    verify_bundle(json.loads(r.content), key)
    r = alice.get("/api/v1/contracts/C-A/checkpoints/consistency",
                  params={"size1": 1, "size2": sizes[1]})
    assert r.status_code == 422 and "size 1" in r.json()["detail"]


def test_dispute_from_the_failure_page_reaches_the_operator(client_for, seed) -> None:
    alice = client_for("a")
    fid = seed.failures["C-A"][0]
    page = alice.get(f"/contracts/C-A/failures/{fid}")
    r = alice.post(f"/contracts/C-A/failures/{fid}/disputes",
                   data={"csrf_token": csrf_of(page.text), "reason": "node logs say otherwise"},
                   follow_redirects=True)
    assert r.status_code == 200 and "node logs say otherwise" in r.text
    # A confirmation, and no form while the dispute is open.
    assert 'data-test="dispute-confirmation"' in r.text and "Open a dispute" not in r.text
    olga = client_for("op")
    queue = olga.get("/operator/disputes")
    assert "node logs say otherwise" in queue.text and "C-B" in queue.text
    did = next(d for d in _disputes(olga) if d["reason"] == "node logs say otherwise")
    r = olga.post(f"/operator/disputes/{did['dispute_id']}",
                  data={"csrf_token": csrf_of(queue.text), "decision": "exclusion",
                        "note": "confirmed: facility issue"}, follow_redirects=True)
    assert r.status_code == 200
    # The operator is told what was recorded.
    assert 'data-test="decided"' in r.text and "is resolved (confirmed: facility issue)" in r.text
    assert 'data-test="decided"' not in olga.get("/operator/disputes").text
    detail = alice.get(f"/api/v1/contracts/C-A/failures/{fid}").json()
    assert detail["row"]["status"] == "excluded"
    assert detail["disputes"][-1]["status"] == "resolved"


def _disputes(client):
    from html.parser import HTMLParser

    found = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "form" and a.get("action", "").startswith("/operator/disputes/"):
                found.append({"dispute_id": a["action"].rsplit("/", 1)[1]})

    text = client.get("/operator/disputes").text
    P().feed(text)
    # The reason sits in the card above each form, in the same order.
    import re

    reasons = re.findall(r"“([^”]*)”", text)
    for d, reason in zip(found, reasons, strict=False):
        d["reason"] = reason
    return found


def test_operator_sees_contracts_at_risk_first(client_for) -> None:
    olga = client_for("op")
    r = olga.get("/operator")
    assert r.status_code == 200
    rows = r.text.split("<tbody>")[1]
    assert rows.index("C-A") < rows.index("C-B")  # all below so far: by margin, then id
    assert 'class="tone-row-bad"' in rows and "below so far" in rows


def test_reports_list_and_pdf(client_for) -> None:
    alice = client_for("a")
    r = alice.get("/contracts/C-A/reports")
    assert r.status_code == 200 and "2026-03" in r.text
    pdf = alice.get("/contracts/C-A/reports/2026-03.pdf")
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    html = alice.get("/contracts/C-A/reports/2026-03.html")
    assert html.status_code == 200 and "C-A" in html.text
    assert alice.get("/contracts/C-A/reports/2031-03.html").status_code == 404


def test_year_close_credit_and_finance_export(seeded) -> None:
    from fastapi.testclient import TestClient

    from tests.web.conftest import login
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    ctx, seed = seeded
    app = create_app(ctx, WebSettings(secret_key="t"), hasher=password_hasher(cheap=True),
                     clock=lambda: datetime(2027, 1, 5, tzinfo=UTC))
    with TestClient(app) as olga:
        login(olga, seed.users["op"])
        page = olga.get("/operator/years")
        assert "C-A" in page.text and page.text.count("ended, closing") == 3  # billing.yearend
        # The overview lists the years waiting to be closed too.
        assert 'data-test="waiting-years"' in olga.get("/operator").text
        # No credit from a single click: the confirmation page says what will be issued.
        confirm = olga.get("/operator/years/confirm", params={"contract_id": "C-A", "year": 1})
        assert confirm.status_code == 200
        assert "Close the year and issue 250,000.00 USD" in confirm.text
        assert ">missed<" in confirm.text
        r = olga.post("/operator/years/close",
                      data={"csrf_token": csrf_of(confirm.text), "contract_id": "C-A",
                            "year": "1"},
                      follow_redirects=True)
        assert r.status_code == 200 and "missed" in r.text
    with TestClient(app) as alice:
        login(alice, seed.users["a"])
        credits = alice.get("/contracts/C-A/credits").text
        assert "guarantee missed" in credits and "250,000.00 USD" in credits
        assert alice.get("/api/v1/contracts/C-A/sla", params={"year": 1}).json()["credit"][
            "amount"] == "250000.00"
    with TestClient(app) as finn:
        login(finn, seed.users["fin"])
        page = finn.get("/finance").text
        assert "CN-C-A-Y1" in page and "250,000.00 USD" in page
        for fmt, magic in (("csv", b"credit"), ("json", b"{"), ("xlsx", b"PK")):
            r = finn.post(f"/finance/export.{fmt}", data={"csrf_token": csrf_of(page)})
            assert r.status_code == 200 and magic in r.content[:200], fmt


def test_api_sla_matches_the_command_line(client_for, seeded) -> None:
    from billing.services import sla_figures
    from yoco.database import unit_of_work

    ctx, _ = seeded
    alice = client_for("a")
    got = alice.get("/api/v1/contracts/C-A/sla", params={"year": 1}).json()
    with unit_of_work(ctx.engine) as s:
        want = sla_figures(s, "C-A", year=1).to_json()
    for k in ("covered_failures", "resolved_failures", "excluded_failures", "pending_failures",
              "resolution_rate", "guarantee_met", "lost_gpu_hours"):
        assert got[k] == want[k], k
    year = alice.get("/api/v1/contracts/C-A/years/1").json()
    assert year["figures"]["covered_failures"] == want["covered_failures"]
    assert sum(m["figures"]["covered_failures"] for m in year["months"] if m["figures"]) == (
        want["covered_failures"])


def test_api_docs_are_served_locally(client_for) -> None:
    c = client_for("a")
    r = c.get("/api/docs")
    assert r.status_code == 200 and "/api/v1/records" in r.text
    assert "cdn" not in r.text.lower() and "https://" not in r.text
    schema = c.get("/api/openapi.json").json()
    assert "/api/v1/contracts/{contract_id}/failures" in schema["paths"]
    assert not any(p.startswith("/contracts") for p in schema["paths"])


def test_a_customer_sees_its_disputes_with_their_wait_and_decision(client_for, seed) -> None:
    alice = client_for("a")
    empty = alice.get("/contracts/C-A/disputes").text
    assert 'data-test="disputes"' in empty  # the seed opened one for each contract
    fid = seed.failures["C-A"][2]
    page = alice.get(f"/contracts/C-A/failures/{fid}")
    alice.post(f"/contracts/C-A/failures/{fid}/disputes",
               data={"csrf_token": csrf_of(page.text), "reason": "thermal was the PDU"})
    html = alice.get("/contracts/C-A/disputes").text
    assert "thermal was the PDU" in html and "we lost more steps" in html
    assert 'aria-current="page">Disputes<' in html
    assert "decide each within 10 days" in html
    waits = html.count('data-test="dispute-wait"')
    assert waits == 2  # both open, each with how long it has waited
    assert "past the 10-day target" not in html  # both were opened just now
    # another customer's disputes are not there, and its page is not found
    assert "C-B" not in html
    assert alice.get("/contracts/C-B/disputes").status_code == 404
    # once decided, the decision and its note show instead of the wait
    olga = client_for("op")
    queue = olga.get("/operator/disputes")
    did = next(d for d in _disputes(olga) if d["reason"] == "thermal was the PDU")
    olga.post(f"/operator/disputes/{did['dispute_id']}",
              data={"csrf_token": csrf_of(queue.text), "decision": "reject",
                    "note": "PDU logs are clean"})
    html = alice.get("/contracts/C-A/disputes").text
    assert "PDU logs are clean" in html and html.count('data-test="dispute-wait"') == 1
