"""Every download names its file per RFC 6266 (``filename*``, UTF-8): a contract id
outside Latin-1 no longer gives a 500. Real PostgreSQL, the real app."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import quote, unquote

from tests import factories as fx
from web.render import attachment

CID = "合同-Ω“7”"  # CJK, Greek and curly quotes: none of it is Latin-1


def _filename(headers: Any) -> str:
    """The exact file name a client reads from ``filename*``."""
    value = headers["content-disposition"]
    value.encode("latin-1")  # a header the server could send at all
    star = value.split("filename*=", 1)[1]
    charset, _, encoded = star.split("'", 2)
    assert charset == "UTF-8"
    return unquote(encoded, encoding="utf-8")


def _add_contract(seeded: Any) -> list[str]:
    from ledger.checkpoints import sign_all
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from yoco.database import unit_of_work

    ctx, _ = seeded
    specs, errors = parse_contracts(json.dumps([fx.contract(CID, customer="Acme AI")]).encode())
    assert not errors
    job = fx.rec("job_started", CID, fx.T0, job_id="j1", gpus=8)
    fail = fx.rec("failure", CID, fx.T0 + timedelta(days=1), job_id="j1",
                  failure_class="unplanned", cause="gpu_lost")
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        recs, errs = validate_batch([job])
        assert not errs
        ingest(s, recs, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
        recs, errs = validate_batch([fail])
        assert not errs
        ingest(s, recs, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    return [job["event_id"], fail["event_id"]]


def test_every_download_of_a_non_latin1_contract_is_named_per_rfc_6266(
        seeded, client_for) -> None:
    """The PDF report, the consistency proof, the log export and an entry's proof: 200
    (was 500, UnicodeEncodeError), and ``filename*`` carries the exact name."""
    _, fail_id = _add_contract(seeded)
    alice = client_for("a")
    path = f"/contracts/{quote(CID, safe='')}"
    cases = {
        # not issued yet: redirected to the draft, named as one
        f"{path}/reports/2026-03.pdf": f"yoco-sla-{CID}-2026-03-draft.pdf",
        f"{path}/checkpoints/consistency?size1=2&size2=3": f"consistency-{CID}-2-3.json",
        f"{path}/log.tar.gz": f"{CID}-log-3.tar.gz",
        f"{path}/entries/{fail_id}/proof": f"proof-{fail_id}.json",
    }
    for url, name in cases.items():
        r = alice.get(url)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
        assert _filename(r.headers) == name, url


def test_the_finance_export_is_named_per_rfc_6266(seeded, client_for) -> None:
    finn = client_for("fin")
    page = finn.get("/finance")
    token = page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    r = finn.post("/finance/export.csv", data={"csrf_token": token})
    assert r.status_code == 200, r.text[:300]
    assert _filename(r.headers).endswith(".csv")


def test_the_header_helper_survives_any_name() -> None:
    for name in ("plain.pdf", "a\"b\\c.pdf", "x\r\ny.pdf", "Ω.pdf", "😀.json", ""):
        header = attachment(name)["Content-Disposition"]
        header.encode("latin-1")
        assert "\r" not in header and "\n" not in header
        fallback = header.split('filename="', 1)[1].split('";', 1)[0]
        assert '"' not in fallback and "\\" not in fallback
    assert attachment("sla-C-1-2026-03.pdf")["Content-Disposition"] == (
        "attachment; filename=\"sla-C-1-2026-03.pdf\"; filename*=UTF-8''sla-C-1-2026-03.pdf")
