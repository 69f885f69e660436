"""The witnessed ledger, end to end on the real database and two real witness processes
over HTTP (one the customer's, one an auditor's): cosigning a growing log, checkpoints
served with the cosignatures, the issue's superuser truncation caught by
``yoco ledger verify`` and refused by both witnesses, and a witness down that delays
cosigning, raises an alert, and stops nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from alerts.models import AlertEvent
from ledger import cosign, note
from ledger.export import export_files
from ledger.ingest import ingest
from ledger.models import CheckpointCosignature, JournalEntry
from ledger.records import validate_batch
from ledger.services import inclusion_bundle
from ledger.witnessing import parse_witnesses, quorum_met
from tests import factories as fx
from tests.witness.conftest import WitnessProcess, start_witness
from yoco.database import unit_of_work
from yoco.scheduler import CheckpointScheduler, submit_and_alert
from yoco.settings import get_settings


class Clock:
    """A monotonic clock moved by hand (one scheduler run per interval)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _progress(app_ctx: Any, n: int, start: int = 0) -> None:
    recs, errors = validate_batch(
        [fx.rec("job_progress", "C-1", fx.later(start + i + 1), job_id="j1", step=start + i,
                step_seconds=1.0) for i in range(n)]
    )
    assert not errors, errors
    with unit_of_work(app_ctx.engine) as s:
        ingest(s, recs, None, app_ctx.projectors)


def _configure(app_ctx: Any, monkeypatch: pytest.MonkeyPatch, ws: list[WitnessProcess],
               extra: str = "") -> str:
    cfg = ", ".join([*(w.config for w in ws), *([extra] if extra else [])])
    monkeypatch.setenv("YOCO_WITNESSES", cfg)
    get_settings.cache_clear()
    app_ctx.__dict__["witnesses"] = parse_witnesses(cfg)
    return cfg


def _two(witnesses: list[WitnessProcess], tmp_path: Path, app_ctx: Any) -> list[WitnessProcess]:
    logs = [f"{app_ctx.settings.log_origin}/*={app_ctx.signer.verifier_text()}"]
    return [start_witness(witnesses, tmp_path, "witness.customer.example/w", logs),
            start_witness(witnesses, tmp_path, "witness.auditor.example/w", logs)]


def _cli(*args: str) -> tuple[int, str]:
    from yoco.cli import build_app

    result = CliRunner().invoke(build_app(), list(args))
    return result.exit_code, result.output


def _cosigned_sizes(app_ctx: Any) -> set[tuple[str, int]]:
    with unit_of_work(app_ctx.engine) as s:
        rows = s.execute(select(CheckpointCosignature.witness, CheckpointCosignature.tree_size))
        return {(parse_witnesses(f"http://x {w}")[0].name, size) for w, size in rows}


def test_two_witnesses_cosign_a_growing_log_and_checkpoints_carry_them(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alerts.models import AlertDelivery, AlertDestination
    from alerts.services import add_webhook

    seed([fx.contract("C-1")], [fx.job_started()])
    with unit_of_work(app_ctx.engine) as s:  # the customer asks for the cosigned heads
        add_webhook(s, name="acme-heads", url="http://127.0.0.1:9/heads", customer="cust-C-1",
                    events=["checkpoint_cosigned"], allow_unsafe_address=True)
        add_webhook(s, name="on-call", url="http://127.0.0.1:9/all", allow_unsafe_address=True)
    ws = _two(witnesses, tmp_path, app_ctx)
    _configure(app_ctx, monkeypatch, ws)
    first = submit_and_alert(app_ctx)
    assert sorted(first.cosigned) == sorted((w.name, "C-1", 2) for w in ws)
    clock = Clock()
    sched = CheckpointScheduler(app_ctx, 300, clock=clock)
    for step in range(3):  # the log grows; every scheduled run signs and gets cosigned
        _progress(app_ctx, 5, start=5 * step)
        clock.now += 300
        assert sched.tick() is not None
    names = {w.name for w in ws}
    assert _cosigned_sizes(app_ctx) == {(n, size) for n in names for size in (2, 7, 12, 17)}
    keys = [cosign.CosignerKey.from_text(w.vkey) for w in ws]
    with unit_of_work(app_ctx.engine) as s:
        files = dict(export_files(s, "C-1"))
        eid = s.execute(select(JournalEntry.event_id).where(
            JournalEntry.log_id == "C-1", JournalEntry.seq == 3)).scalar_one()
        bundle = inclusion_bundle(s, str(eid))
    exported = files["checkpoint"].decode()
    # The note format: the log's signature, then one extra line per witness.
    assert len(cosign.signature_lines(exported)) == 3
    assert quorum_met(exported, keys, 2) and not quorum_met(exported, keys[:1], 2)
    assert note.open_checkpoint(exported, app_ctx.verifier).size == 17
    assert quorum_met(bundle["checkpoint"], keys, 2)
    code, out = _cli("ledger", "verify")
    assert code == 0, out
    assert "witnesses: 2 cosigned head(s) of 2 witness(es) compared" in out

    # Every head that reached the quorum went out to the customer's webhook only (opt-in).
    with unit_of_work(app_ctx.engine) as s:
        published = s.execute(
            select(AlertEvent.key, AlertDestination.name, AlertEvent.data)
            .join(AlertDelivery, AlertDelivery.event_id == AlertEvent.id)
            .join(AlertDestination, AlertDestination.id == AlertDelivery.destination_id)
            .where(AlertEvent.kind == "checkpoint_cosigned").order_by(AlertEvent.id)
        ).all()
    assert [(k, d) for k, d, _ in published] == [
        (f"checkpoint_cosigned:C-1:{n}", "acme-heads") for n in (2, 7, 12, 17)]
    assert quorum_met(published[-1][2]["note"], keys, 2)

    # The customer's side: yoco-verify requires the cosignatures of the witnesses it trusts.
    from yoco_verify.cli import run as verify

    from ledger.cosign import Cosigner
    from ledger.export import export_to_dir

    with unit_of_work(app_ctx.engine) as s:
        export_to_dir(s, "C-1", tmp_path / "export")
    base = [str(tmp_path / "export"), "-k", app_ctx.signer.verifier_text(), "-q"]
    trusted = [a for w in ws for a in ("--witness-key", w.vkey)]
    assert verify([*base, *trusted]) == 0
    stranger = Cosigner.generate("witness.stranger.example/w").key.to_text()
    assert verify([*base, *trusted, "--witness-key", stranger]) == 1  # all three: not met
    assert verify([*base, *trusted, "--witness-key", stranger, "--quorum", "2"]) == 0


def _truncate(owner_engine: Engine, log_id: str, size: int) -> None:
    """What the issue's DBA did with superuser rights: remove the log's entries from
    ``size`` on, the checkpoints (and cosignatures) that covered them, their Merkle nodes,
    and shrink the log."""
    tables = ("checkpoint_cosignatures", "checkpoints", "journal_entries", "merkle_nodes",
              "ledger_logs")
    with owner_engine.begin() as c:
        for t in tables:
            c.execute(text(f"ALTER TABLE {t} DISABLE TRIGGER USER"))
        p = {"log": log_id, "size": size}
        c.execute(text("DELETE FROM checkpoint_cosignatures WHERE log_id = :log "
                       "AND tree_size > :size"), p)
        c.execute(text("DELETE FROM checkpoints WHERE log_id = :log AND tree_size > :size"), p)
        c.execute(text("DELETE FROM journal_entries WHERE log_id = :log AND seq >= :size"), p)
        c.execute(text("DELETE FROM merkle_nodes WHERE log_id = :log "
                       "AND (idx + 1) * (2 ^ level)::bigint > :size"), p)
        c.execute(text("UPDATE ledger_logs SET size = :size WHERE log_id = :log"), p)
        for t in tables:
            c.execute(text(f"ALTER TABLE {t} ENABLE TRIGGER USER"))


def test_the_superuser_truncation_is_caught_and_refused(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner_engine: Engine,
) -> None:
    seed([fx.contract("C-1"), fx.contract("C-2")],
         [fx.job_started(), fx.rec("job_started", "C-2", job_id="j1", gpus=8)])
    _progress(app_ctx, 5)
    ws = _two(witnesses, tmp_path, app_ctx)
    cfg = _configure(app_ctx, monkeypatch, ws)
    assert _cli("ledger", "checkpoint")[0] == 0  # 7 entries, signed and cosigned
    _progress(app_ctx, 3, start=5)
    code, out = _cli("ledger", "checkpoint")  # 10 entries, signed and cosigned
    assert code == 0 and "2 cosignature(s) stored" in " ".join(out.split())
    assert ("witness.customer.example/w", 10) in _cosigned_sizes(app_ctx)

    _truncate(owner_engine, "C-1", 7)  # the last three entries, their checkpoint, nodes
    assert _cli("ledger", "rebuild")[0] == 0  # and the projections made to agree
    monkeypatch.delenv("YOCO_WITNESSES")
    get_settings.cache_clear()
    code, out = _cli("ledger", "verify")
    assert code == 0 and "all match" in out  # what the issue saw, without witnesses

    monkeypatch.setenv("YOCO_WITNESSES", cfg)
    get_settings.cache_clear()
    code, out = _cli("ledger", "verify")
    assert code == 1
    flat = " ".join(out.split())
    assert "log 'C-1'" in flat and "holds 7 entries" in flat and "cosigned size 10" in flat

    # The log goes on from the truncated head: signed here, refused by both witnesses.
    _progress(app_ctx, 1, start=20)
    code, out = _cli("ledger", "checkpoint")
    assert code == 0 and "signed: C-1 size 8" in out
    flat = " ".join(out.split())
    assert "2 refusal(s)" in flat and "beyond this database's head 8" in flat
    with unit_of_work(app_ctx.engine) as s:
        refused = s.execute(select(AlertEvent.key).where(
            AlertEvent.kind == "witness_refused")).scalars().all()
    assert sorted(refused) == sorted(f"witness_refused:{w.name}:C-1:8" for w in ws)
    assert ("witness.customer.example/w", 8) not in _cosigned_sizes(app_ctx)


def test_a_witness_down_delays_cosigning_raises_an_alert_and_stops_nothing(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed([fx.contract("C-1")], [fx.job_started()], sign=False)
    up, down = _two(witnesses, tmp_path, app_ctx)
    _configure(app_ctx, monkeypatch, [up, down])
    down.kill()  # the auditor's witness is down from the start
    clock = Clock()
    sched = CheckpointScheduler(app_ctx, 300, clock=clock)
    run = sched.tick()
    assert run is not None and [h.tree_size for h in run.heads] == [2]  # signed regardless
    _progress(app_ctx, 4)  # ingest goes on
    clock.now += 300
    run = sched.tick()
    assert run is not None and [h.tree_size for h in run.heads] == [6]
    assert _cosigned_sizes(app_ctx) == {(up.name, 2), (up.name, 6)}
    with unit_of_work(app_ctx.engine) as s:
        alerts = s.execute(select(AlertEvent.key, AlertEvent.subject).where(
            AlertEvent.kind == "witness_down")).all()
    assert len(alerts) == 1  # one outage, one alert (not one per run)
    assert alerts[0].key == f"witness_down:{down.name}:never"
    assert "cannot be reached" in alerts[0].subject

    down.start()  # back: the next run catches up from its last size (none)
    clock.now += 300
    assert sched.tick() is not None
    assert (down.name, 6) in _cosigned_sizes(app_ctx)


def test_a_customer_witness_of_its_own_logs_is_not_an_alert_for_the_others(
    seed: Callable[..., None], app_ctx: Any, witnesses: list[WitnessProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed([fx.contract("C-1"), fx.contract("C-2")],
         [fx.job_started(), fx.rec("job_started", "C-2", job_id="j1", gpus=8)])
    mine = start_witness(witnesses, tmp_path, "witness.customer.example/w", [
        f"{app_ctx.settings.log_origin}/C-1={app_ctx.signer.verifier_text()}"])
    _configure(app_ctx, monkeypatch, [mine])
    run = submit_and_alert(app_ctx)
    assert run.cosigned == [(mine.name, "C-1", 2)]
    assert run.not_watched == 1 and run.refused == [] and run.down == {}
    with unit_of_work(app_ctx.engine) as s:
        kinds = s.execute(select(AlertEvent.kind)).scalars().all()
    assert "witness_refused" not in kinds
