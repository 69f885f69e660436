"""An evidence pack under a contract with a witness policy (two real witness processes
over HTTP, 2 of 2): the pack's log is cut at the newest checkpoint that meets the policy
-- a newer one with too few cosignatures is passed over -- and while none that meets it
holds the report's entry the pack is refused, naming the checkpoint it would rest on.
The real ``yoco-verify`` accepts the pack with its README's command and holds the log to
the contract's policy."""

from __future__ import annotations

import io
import shlex
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reports import issued as ri
from reports.evidence import EvidenceNotReady, build_evidence_pack
from tests.witness.conftest import WitnessProcess
from tests.witness.test_witness_policy_db import (
    AUDITOR,
    CUSTOMER,
    _contract,
    _latest_signed,
    _log_size,
    _records,
)
from tests.witness.test_witnessed_ledger_db import _configure, _progress, _two
from yoco.database import unit_of_work
from yoco.scheduler import submit_and_alert


def _pack(app_ctx: Any) -> Any:
    with unit_of_work(app_ctx.engine) as s:
        return build_evidence_pack(s, "C-1", "2025-12")


def test_the_pack_rests_on_the_newest_checkpoint_meeting_the_witness_policy(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from yoco_verify.cli import run as yoco_verify

    ws = _two(witnesses, tmp_path, app_ctx)
    cust, _aud = ws
    seed([_contract(ws)], _records())  # checkpoint `first`, cosigned by nobody yet
    first = _log_size(app_ctx)
    _configure(app_ctx, monkeypatch, ws)
    submit_and_alert(app_ctx)  # both cosign it: it meets the policy
    with unit_of_work(app_ctx.engine) as s:
        doc = ri.issue_month(s, "C-1", 2025, 12)
    assert doc.checkpoint_size == first and doc.seq == first

    # The only checkpoint meeting the policy predates the report's entry: refused.
    with pytest.raises(EvidenceNotReady, match=(
            f"ledger entry {first} of contract 'C-1' is not under a signed checkpoint "
            f"meeting its witness policy yet \\(checkpoint {first} holds entries 0 to "
            f"{first - 1}\\)")):
        _pack(app_ctx)
    # A newer checkpoint holds the entry, but only the customer's witness cosigns it
    # (1 of the 2 the policy needs): it is not the one chosen, the pack is still refused.
    holding = _latest_signed(app_ctx)
    assert holding == first + 1
    _configure(app_ctx, monkeypatch, [cust])
    submit_and_alert(app_ctx)
    with pytest.raises(EvidenceNotReady, match=f"\\(checkpoint {first} holds entries"):
        _pack(app_ctx)

    # Both witnesses cosign it: it meets the policy and the pack rests on it.
    _configure(app_ctx, monkeypatch, ws)
    submit_and_alert(app_ctx)
    assert _pack(app_ctx).log_tree_size == holding
    # The log grows and a newer head is cosigned by the customer's witness alone: the
    # pack still rests on `holding`, the newest checkpoint that meets the policy.
    _progress(app_ctx, 2)
    newest = _latest_signed(app_ctx)
    assert newest == holding + 2
    _configure(app_ctx, monkeypatch, [cust])
    submit_and_alert(app_ctx)
    pack = _pack(app_ctx)
    assert pack.log_tree_size == holding and pack.issued_checkpoint == first
    with zipfile.ZipFile(io.BytesIO(pack.data)) as zf:
        zf.extractall(tmp_path / "pack")
        names = [n.split("/", 1)[1] for n in zf.namelist()]
    assert f"C-1-log-{holding}.tar.gz" in names and f"C-1-log-{newest}.tar.gz" not in names
    folder = tmp_path / "pack" / "yoco-evidence-C-1-2025-12"
    readme = (folder / "README.txt").read_text()
    assert "Your contract names witnesses (terms.witnesses): add --terms" in readme
    checkpoint = (folder / f"checkpoint-{first}").read_text()
    assert f"\u2014 {CUSTOMER} " in checkpoint and f"\u2014 {AUDITOR} " in checkpoint

    (folder / "operator.key").write_text(app_ctx.signer.verifier_text() + "\n")
    [line] = [ln.strip() for ln in readme.splitlines() if ln.strip().startswith("yoco-verify ")]
    argv = shlex.split(line)
    monkeypatch.chdir(folder)
    capsys.readouterr()
    code = yoco_verify(argv[1:])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out
    assert (f"witness policy (the contract's terms in the log): 2 of 2 witnesses: "
            f"{CUSTOMER}, {AUDITOR}; cosigned by {CUSTOMER}, {AUDITOR}") in out, out
    assert out.endswith("OK: every check passed and every figure matches"), out
