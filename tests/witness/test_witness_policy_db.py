"""A contract's witness policy end to end, on the real database and two real witness
processes over HTTP (the customer's and an auditor's): bad policy input refused naming
the field; monthly reports and year-end statements state whether their checkpoint meets
the policy and are issued only over one that does; the portal says so; ``yoco-verify``
requires it from the log's own terms (or the customer's copy), naming the missing
witnesses, and counts neither a duplicate, a forgery nor a cosignature of another root."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from ledger import cosign, note
from ledger.checkpoints import sign_all
from ledger.contracts import list_contracts
from ledger.export import export_to_dir
from ledger.models import JournalEntry
from reports import issued as ri
from reports.errors import NotWitnessed
from reports.models import STATEMENT
from tests import factories as fx
from tests.witness.conftest import WitnessProcess
from tests.witness.test_witnessed_ledger_db import _cli, _configure, _progress, _two
from yoco.database import unit_of_work
from yoco.scheduler import submit_and_alert

CUSTOMER = "witness.customer.example/w"
AUDITOR = "witness.auditor.example/w"


def _records() -> list[dict[str, Any]]:
    start = fx.rec("job_started", "C-1", datetime(2025, 6, 1, tzinfo=UTC), job_id="j1",
                   gpus=8)
    f = fx.rec("failure", "C-1", datetime(2025, 12, 10, tzinfo=UTC), job_id="j1",
               failure_class="unplanned", cause="gpu_lost", node="n-1", gpu=3, step=100)
    o = fx.rec("outcome", "C-1", datetime(2025, 12, 10, 0, 1, tzinfo=UTC),
               failure_event_id=f["event_id"], outcome="live_migrated", lost_steps=0,
               recovery_seconds=2.5, step_seconds=1.5, gpus_affected=8)
    return [start, f, o]


def _contract(ws: list[WitnessProcess], quorum: int = 2) -> dict[str, Any]:
    return fx.contract("C-1", start_date="2025-01-01",
                       terms={"witnesses": {"keys": [w.vkey for w in ws], "quorum": quorum}})


def _log_size(app_ctx: Any) -> int:
    with unit_of_work(app_ctx.engine) as s:
        return int(s.execute(select(func.count()).select_from(JournalEntry).where(
            JournalEntry.log_id == "C-1")).scalar_one())


def _latest_signed(app_ctx: Any) -> int:
    with unit_of_work(app_ctx.engine) as s:
        heads = sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    return next(h.tree_size for h in heads if h.log_id == "C-1")


def test_bad_policy_input_names_the_field_and_changes_nothing(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path,
) -> None:
    good = cosign.Cosigner.generate(CUSTOMER).key.to_text()
    file = tmp_path / "contracts.json"
    file.write_text(json.dumps([
        fx.contract("C-OK"),
        fx.contract("C-1", terms={"witnesses": {"keys": [good], "quorum": 3}}),
    ]))
    code, out = _cli("contracts", "import", str(file))
    flat = " ".join(out.split())
    assert code != 0 and "terms.witnesses.quorum" in flat and "from 1 to the 1" in flat
    with unit_of_work(app_ctx.engine) as s:
        assert list_contracts(s) == []  # all or nothing: not even the good one

    seed([fx.contract("C-1")], [fx.job_started()])
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"keys": [good, "not-a-key"]}))
    before = _log_size(app_ctx)
    code, out = _cli("billing", "amend", "C-1", "--type", "terms", "--effective",
                     "2026-06-01", "--witnesses", str(policy))
    flat = " ".join(out.split())
    assert code != 0 and "changes.terms.witnesses.keys[1]" in flat
    assert _log_size(app_ctx) == before
    policy.write_text(json.dumps({"keys": [good], "quorum": 1}))
    code, out = _cli("billing", "amend", "C-1", "--type", "terms", "--effective",
                     "2026-06-01", "--witnesses", str(policy))
    assert code == 0, out
    assert _log_size(app_ctx) == before + 1


def test_reports_state_the_policy_and_are_issued_only_over_a_witnessed_checkpoint(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = _two(witnesses, tmp_path, app_ctx)
    cust, aud = ws
    seed([_contract(ws)], _records())  # signed: checkpoint 4, cosigned by nobody yet
    first = _log_size(app_ctx)

    with unit_of_work(app_ctx.engine) as s:
        draft = ri.render_draft(s, "C-1", 2025, 12, with_pdf=False)
    assert draft.witness is not None and not draft.witness.met
    assert f"missing: {CUSTOMER}, {AUDITOR}" in draft.html
    assert "Not yet." in draft.html and '"met": false' in draft.html

    def issue() -> ri.IssuedReport:
        with unit_of_work(app_ctx.engine) as s:
            return ri.issue_month(s, "C-1", 2025, 12)

    with pytest.raises(NotWitnessed, match=f"missing: {CUSTOMER}, {AUDITOR}"):
        issue()
    _configure(app_ctx, monkeypatch, [cust])  # only the customer's witness cosigns
    submit_and_alert(app_ctx)
    with pytest.raises(NotWitnessed, match=f"cosigned by 1 of the 2 .*\\(missing: {AUDITOR}\\)"):
        issue()
    with unit_of_work(app_ctx.engine) as s:
        assert ri.list_issued(s, "C-1") == []
    assert _log_size(app_ctx) == first  # refused: nothing recorded

    _configure(app_ctx, monkeypatch, ws)
    submit_and_alert(app_ctx)  # both cosign checkpoint 4
    _progress(app_ctx, 3)
    newer = _latest_signed(app_ctx)  # a newer checkpoint, not cosigned yet
    assert newer == first + 3
    doc = issue()
    assert doc.created and doc.checkpoint_size == first  # the witnessed one, not the latest
    html = doc.html_bytes.decode()
    assert "<strong>Yes.</strong>" in html and '"met": true' in html
    assert "meets the contract&#39;s witness policy (2 of 2 witnesses" in html
    assert cust.vkey in html and aud.vkey in html

    # The year-end statement: the close is signed, not yet cosigned, so not issued yet.
    from billing.closing import close_year

    with unit_of_work(app_ctx.engine) as s:
        close_year(s, "C-1", 1, signer=app_ctx.signer, origin_prefix=app_ctx.settings.log_origin)
    with (pytest.raises(NotWitnessed, match=f"missing: {CUSTOMER}, {AUDITOR}"),
          unit_of_work(app_ctx.engine) as s):
        ri.issue_year_statement(s, "C-1", 1)
    submit_and_alert(app_ctx)
    with unit_of_work(app_ctx.engine) as s:
        st = ri.issue_year_statement(s, "C-1", 1)
    assert st.created and "Witnessed: yes." in st.html_bytes.decode()

    # The portal states it: the checkpoints page per head, the reports page per document.
    from fastapi.testclient import TestClient

    from tests.web.conftest import PASSWORD, login
    from web.accounts import add_user
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    hasher = password_hasher(cheap=True)
    with unit_of_work(app_ctx.engine) as s:
        add_user(s, hasher, email="c@cust.example", name="C", role="customer",
                 password=PASSWORD, customer="cust-C-1")
    app = create_app(app_ctx, WebSettings(secret_key="k", figures_ttl_seconds=0),
                     hasher=hasher)
    with TestClient(app) as client:
        assert login(client, "c@cust.example").status_code == 303
        page = client.get("/contracts/C-1/checkpoints").text
        assert 'id="witness-policy"' in page and cust.vkey in page
        assert re.search(rf'data-test="witness-{first}"><span[^>]*>witnessed<', page)
        assert re.search(rf'data-test="witness-{newer}"><span[^>]*>not yet witnessed</span>'
                         rf' \(missing: {CUSTOMER}, {AUDITOR}\)', page)
        page = client.get("/contracts/C-1/reports?year=1").text
        assert 'data-test="witness-2025-12">witnessed<' in page
        assert 'data-test="witness-year-1">witnessed<' in page

    # The customer's verifier checks the issued report's statement against the log.
    from yoco_verify.cli import run as verify

    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    submit_and_alert(app_ctx)
    with unit_of_work(app_ctx.engine) as s:
        export_to_dir(s, "C-1", tmp_path / "export")
    (tmp_path / "r.html").write_bytes(doc.html_bytes)
    (tmp_path / "r.pdf").write_bytes(doc.pdf)
    assert verify([str(tmp_path / "export"), "-k", app_ctx.signer.verifier_text(), "-q",
                   "--report", str(tmp_path / "r.html"), "--report",
                   str(tmp_path / "r.pdf")]) == 0
    from io import BytesIO

    from pypdf import PdfReader

    text = " ".join(" ".join(p.extract_text() for p in PdfReader(BytesIO(doc.pdf)).pages)
                    .split())
    assert f"Witnessed Yes. Checkpoint {first} meets the contract's witness policy" in text
    with unit_of_work(app_ctx.engine) as s:
        assert [d.period for d in ri.list_issued(s, "C-1", STATEMENT)] == ["year-1"]


def _checkpoint_file(folder: Path) -> Path:
    return folder / "checkpoint"


def test_yoco_verify_requires_the_contracts_policy_and_names_the_missing_witnesses(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from yoco_verify.cli import run as verify

    ws = _two(witnesses, tmp_path, app_ctx)
    cust, aud = ws
    seed([_contract(ws)], _records())
    _configure(app_ctx, monkeypatch, ws)
    submit_and_alert(app_ctx)
    base = ["-k", app_ctx.signer.verifier_text()]

    def run(folder: Path, *extra: str) -> tuple[int, str]:
        capsys.readouterr()
        code = verify([str(folder), *base, *extra])
        return code, " ".join(capsys.readouterr().out.split())

    met = tmp_path / "met"
    with unit_of_work(app_ctx.engine) as s:
        export_to_dir(s, "C-1", met)
    code, out = run(met)
    assert code == 0, out
    assert (f"witness policy (the contract's terms in the log): 2 of 2 witnesses: "
            f"{CUSTOMER}, {AUDITOR}; cosigned by {CUSTOMER}, {AUDITOR}") in out
    older = _checkpoint_file(met).read_text()

    aud.kill()  # the auditor's witness is down: the next checkpoint has one cosignature
    _progress(app_ctx, 2)
    _latest_signed(app_ctx)
    run_ = submit_and_alert(app_ctx)
    assert AUDITOR in run_.down
    short = tmp_path / "short"
    with unit_of_work(app_ctx.engine) as s:
        export_to_dir(s, "C-1", short)
    code, out = run(short)
    assert code == 1
    assert (f"cosigned by 1 of the 2 witnesses the contract's policy names, which needs 2 "
            f"(missing: {AUDITOR}): the checkpoint does not meet the contract's witness "
            "policy") in out
    signed = _checkpoint_file(short).read_text()
    mine = [ln for ln in cosign.signature_lines(signed) if ln.startswith(f"\u2014 {CUSTOMER} ")]
    assert len(mine) == 1

    def tampered(name: str, extra: str) -> Path:
        folder = tmp_path / name
        _copy_export(short, folder)
        _checkpoint_file(folder).write_text(signed + extra)
        return folder

    # The customer's cosignature twice (another timestamp: a valid line) counts once.
    again = cosign.Cosigner.from_text(cust.key_file.read_text()).cosign(
        note.unverified_text(signed), 1_900_000_000)
    # A forged line under the auditor's name and key ID.
    aud_key = cosign.CosignerKey.from_text(aud.vkey)
    blob = aud_key.key_id.to_bytes(4, "big") + (1_800_000_000).to_bytes(8, "big") + os.urandom(64)
    forged = f"\u2014 {AUDITOR} {base64.b64encode(blob).decode()}\n"
    # The auditor's real cosignature of the older checkpoint (another size and root).
    moved = next(ln for ln in cosign.signature_lines(older) if ln.startswith(f"\u2014 {AUDITOR} "))
    for name, extra in (("dup", again), ("forged", forged), ("moved", moved)):
        code, out = run(tampered(name, extra))
        assert code == 1, (name, out)
        assert f"(missing: {AUDITOR})" in out, (name, out)

    # The customer's own copy of the terms: required too, and a difference is reported.
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps({"witnesses": {"keys": [cust.vkey], "quorum": 1}}))
    code, out = run(short, "--terms", str(terms))
    assert code == 1
    assert f"witness policy (your terms, terms.json): 1 of 1 witnesses: {CUSTOMER}; " \
           f"cosigned by {CUSTOMER}" in out
    assert "the contract in the log is not the one you hold" in out
    terms.write_text(json.dumps(_contract(ws)))
    code, out = run(met, "--terms", str(terms))
    assert code == 0, out
    terms.write_text(json.dumps({"terms": {"witnesses": {"keys": [cust.vkey], "quorum": 0}}}))
    code, out = run(met, "--terms", str(terms))
    assert code == 1 and "terms.witnesses.quorum: must be an integer from 1" in out


def _copy_export(src: Path, dst: Path) -> None:
    """Copy an exported log folder (tiles and checkpoint)."""
    import shutil

    shutil.copytree(src, dst)
