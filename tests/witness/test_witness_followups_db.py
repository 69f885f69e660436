"""Follow-ups of the witness policy, on the real database and real witness processes:
the tags of the answers that show checkpoint notes (the checkpoint list, an inclusion
proof, a consistency proof, the log export) name the cosignatures, so one stored after
its checkpoint was signed is shown at once, not after the next head; a policy naming witnesses the ledger
never asks is warned of on the CLI (naming them) and, when it cannot be met, raises the
operator's ``witness_policy_unmet`` alert."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from alerts.models import AlertEvent
from ledger import cosign
from tests import factories as fx
from tests.witness.conftest import WitnessProcess
from tests.witness.test_witnessed_ledger_db import _cli, _configure, _progress, _two
from yoco.database import unit_of_work
from yoco.scheduler import CheckpointScheduler, submit_and_alert


def test_a_cosignature_stored_after_signing_changes_the_tags_of_what_shows_it(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi.testclient import TestClient

    from ledger.checkpoints import sign_all
    from ledger.models import JournalEntry
    from web.accounts import create_token
    from web.app import create_app
    from web.security import password_hasher
    from web.settings import WebSettings

    cust, aud = _two(witnesses, tmp_path, app_ctx)
    start = fx.job_started()
    seed([fx.contract("C-1")], [start])  # signed at 2; cosigned by nobody yet
    _progress(app_ctx, 2)
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)  # and at 4
        token = create_token(s, name="read-c1", customer="cust-C-1").text
        eid = str(s.execute(select(JournalEntry.event_id).where(
            JournalEntry.log_id == "C-1", JournalEntry.seq == 1)).scalar_one())
    app = create_app(app_ctx, WebSettings(secret_key="k", figures_ttl_seconds=0),
                     hasher=password_hasher(cheap=True))
    auth = {"Authorization": f"Bearer {token}"}
    url = "/api/v1/contracts/C-1/checkpoints"
    # Every answer that shows a checkpoint's note, and so its cosignature lines.
    shown = [url, f"/api/v1/contracts/C-1/entries/{eid}/proof",
             "/api/v1/contracts/C-1/checkpoints/consistency?size1=2&size2=4",
             "/api/v1/contracts/C-1/log.tar.gz"]
    with TestClient(app) as client:
        first = client.get(url, headers=auth)
        assert first.status_code == 200, first.text
        tag = first.headers["ETag"]
        heads = first.json()
        assert [h["tree_size"] for h in heads] == [4, 2]
        assert cust.name not in heads[0]["note"] and aud.name not in heads[0]["note"]
        tags = {}
        for u in shown:
            r = client.get(u, headers=auth)
            assert r.status_code == 200, (u, r.text)
            tags[u] = r.headers["ETag"]
            # asked again unchanged: not modified (kept and tagged as before)
            assert client.get(u, headers={**auth, "If-None-Match": tags[u]}
                              ).status_code == 304, u

        _configure(app_ctx, monkeypatch, [cust])  # the customer's witness cosigns head 4
        submit_and_alert(app_ctx)
        second = client.get(url, headers={**auth, "If-None-Match": tag})
        assert second.status_code == 200, second.text
        assert second.headers["ETag"] != tag
        heads2 = second.json()
        assert [h["tree_size"] for h in heads2] == [4, 2]  # the same heads, none newer
        assert f"\u2014 {cust.name} " in heads2[0]["note"]
        assert aud.name not in heads2[0]["note"]
        proof = client.get(shown[1], headers={**auth, "If-None-Match": tags[shown[1]]})
        assert proof.status_code == 200 and f"\u2014 {cust.name} " in proof.text
        consistency = client.get(shown[2], headers={**auth, "If-None-Match": tags[shown[2]]})
        assert consistency.status_code == 200 and f"\u2014 {cust.name} " in consistency.text
        export = client.get(shown[3], headers={**auth, "If-None-Match": tags[shown[3]]})
        assert export.status_code == 200 and export.headers["ETag"] != tags[shown[3]]

        # the second witness's cosignature of the same head changes the tag again
        _configure(app_ctx, monkeypatch, [cust, aud])
        submit_and_alert(app_ctx)
        third = client.get(url, headers={**auth, "If-None-Match": second.headers["ETag"]})
        assert third.status_code == 200
        assert f"\u2014 {aud.name} " in third.json()[0]["note"]
        assert client.get(url, headers={**auth, "If-None-Match": third.headers["ETag"]}
                          ).status_code == 304


def _unmet_alerts(app_ctx: Any) -> list[AlertEvent]:
    with unit_of_work(app_ctx.engine) as s:
        return list(s.execute(select(AlertEvent).where(
            AlertEvent.kind == "witness_policy_unmet").order_by(AlertEvent.id)).scalars())


def test_a_policy_naming_unconfigured_witnesses_is_warned_of_and_alerted(
    app_ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ledger.contracts import list_contracts
    from yoco.settings import get_settings

    cust = cosign.Cosigner.generate("witness.customer.example/w").key.to_text()
    aud = cosign.Cosigner.generate("witness.auditor.example/w").key.to_text()
    # Only the customer's witness is configured (its URL answers nothing: never asked here
    # except by the scheduler's run, where it is merely down).
    monkeypatch.setenv("YOCO_WITNESSES", f"http://127.0.0.1:9 {cust}")
    get_settings.cache_clear()

    file = tmp_path / "contracts.json"
    file.write_text(json.dumps([
        fx.contract("C-1", terms={"witnesses": {"keys": [cust, aud], "quorum": 2}}),
        fx.contract("C-2", terms={"witnesses": {"keys": [cust, aud], "quorum": 1}}),
        fx.contract("C-3", terms={"witnesses": {"keys": [cust], "quorum": 1}}),
        fx.contract("C-4"),
    ]))
    code, out = _cli("contracts", "import", str(file))
    flat = " ".join(out.split())
    assert code == 0, out  # recorded all the same
    with unit_of_work(app_ctx.engine) as s:
        assert [c.contract_id for c in list_contracts(s)] == ["C-1", "C-2", "C-3", "C-4"]
    # C-1: 2 of 2, the auditor's never asked: cannot be met, named, alerted
    assert ("warning: contract C-1: its witness policy (2 of 2 witnesses: "
            "witness.customer.example/w, witness.auditor.example/w) names "
            "witness.auditor.example/w, not among the witnesses this ledger submits "
            "checkpoints to (YOCO_WITNESSES): only 1 of the 2 cosignatures it needs can "
            "ever be collected") in flat
    assert "witness_policy_unmet raised" in flat
    # C-2: 1 of 2: still met by the customer's, warned of, not alerted
    assert ("warning: contract C-2: its witness policy (1 of 2 witnesses: "
            "witness.customer.example/w, witness.auditor.example/w) names "
            "witness.auditor.example/w") in flat
    assert "can still be met by the 1 configured one(s)" in flat
    assert "warning: contract C-3" not in flat and "warning: contract C-4" not in flat
    [alert] = _unmet_alerts(app_ctx)
    assert alert.key == "witness_policy_unmet:C-1:witness.auditor.example/w"
    assert alert.contract_id is None  # the operator's: the fix is the configuration
    assert alert.data["unconfigured"] == ["witness.auditor.example/w"]
    assert alert.data["configured"] == 1

    # A retry of the same import warns again; the alert is raised once.
    code, out = _cli("contracts", "import", str(file))
    assert code == 0 and "warning: contract C-1" in " ".join(out.split())
    assert len(_unmet_alerts(app_ctx)) == 1

    # An amendment to a policy the configured witness meets: no warning.
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"keys": [cust], "quorum": 1}))
    code, out = _cli("billing", "amend", "C-1", "--type", "terms", "--effective",
                     "2026-06-01", "--witnesses", str(policy))
    assert code == 0, out
    assert "warning" not in out
    # An amendment of C-3 to the auditor's only: recorded, warned of, alerted.
    policy.write_text(json.dumps({"keys": [aud], "quorum": 1}))
    code, out = _cli("billing", "amend", "C-3", "--type", "terms", "--effective",
                     "2026-06-01", "--witnesses", str(policy))
    flat = " ".join(out.split())
    assert code == 0 and "amendment" in flat and "recorded" in flat, out
    assert ("warning: contract C-3: its witness policy (1 of 1 witnesses: "
            "witness.auditor.example/w) names witness.auditor.example/w") in flat
    assert [a.key for a in _unmet_alerts(app_ctx)] == [
        "witness_policy_unmet:C-1:witness.auditor.example/w",
        "witness_policy_unmet:C-3:witness.auditor.example/w",
    ]

    # The configuration changes (no witness at all): the checkpoint run finds every
    # policy out of reach and alerts the ones not alerted for those witnesses yet.
    monkeypatch.setenv("YOCO_WITNESSES", "")
    get_settings.cache_clear()
    app_ctx.__dict__["witnesses"] = []
    CheckpointScheduler(app_ctx, 60.0).run_once()
    assert [a.key for a in _unmet_alerts(app_ctx)][2:] == [
        "witness_policy_unmet:C-1:witness.customer.example/w",
        "witness_policy_unmet:C-2:witness.auditor.example/w,witness.customer.example/w",
    ]
