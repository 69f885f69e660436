"""The checkpoint signer's key name is the checkpoint's origin (C2SP
tlog-checkpoint: the key name SHOULD be the origin), and checkpoints signed before, under
the operator's key name, stay verifiable: by `yoco ledger verify`, by `yoco-verify` with
the operator's pinned key, and as Go's note.Open reads them. Real PostgreSQL, the real
signer, the real export."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from ledger import note, tree
from ledger.checkpoints import origin_of, sign_all
from ledger.models import Checkpoint
from tests import factories as fx
from tests.audit.conftest import verify
from tests.ledger.test_note import _go_open
from yoco.database import unit_of_work


def _cli(*args: str, code: int = 0) -> str:
    from yoco.cli import build_app

    result = CliRunner().invoke(build_app(), list(args))
    assert result.exit_code == code, result.output
    return result.output


def test_new_checkpoints_are_signed_under_their_origin_and_old_ones_still_verify(
    seed: Callable[..., None], app_ctx: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cid = "C-KEY"
    origin = origin_of(app_ctx.settings.log_origin, cid)
    operator = app_ctx.signer
    # The log's first checkpoint, signed the old way: under the operator's key name.
    seed([fx.contract(cid)], [fx.rec("job_started", cid, fx.T0, job_id="j1", gpus=8)],
         sign=False)
    with unit_of_work(app_ctx.engine) as s:
        root = tree.root(s, cid, 2)
        old_note = note.sign_note(note.format_checkpoint(origin, 2, root), operator)
        s.add(Checkpoint(log_id=cid, tree_size=2, root_hash=root, origin=origin,
                         key_id=operator.verifier_text(), note=old_note))
    assert f"\u2014 {operator.name} " in old_note and operator.name != origin

    # Signed now: under the origin, consistent with the old head.
    seed([], [fx.rec("job_finished", cid, fx.T0 + timedelta(hours=1), job_id="j1", step=5)],
         sign=False)
    with unit_of_work(app_ctx.engine) as s:
        heads = sign_all(s, operator, app_ctx.settings.log_origin)
    assert [(h.log_id, h.tree_size, h.created) for h in heads] == [(cid, 3, True)]
    with unit_of_work(app_ctx.engine) as s:
        rows = s.execute(select(Checkpoint).where(Checkpoint.log_id == cid)
                         .order_by(Checkpoint.tree_size)).scalars().all()
        got = [(r.tree_size, r.key_id, r.note) for r in rows]
    (_, old_key, old_text), (size, new_key, new_text) = got
    per_log = operator.verifier.named(origin)
    assert size == 3 and old_key == operator.verifier_text() and old_text == old_note
    assert new_key == per_log.to_text()
    assert f"\n\n\u2014 {origin} " in new_text
    # Go's reading: the new note with the per-log key, the old one with the operator's.
    assert _go_open(new_text, new_key).startswith(f"{origin}\n3\n")
    assert _go_open(old_text, old_key).startswith(f"{origin}\n2\n")
    # The CLI prints that per-log key.
    assert _cli("ledger", "public-key", "--log", cid).strip() == new_key
    assert _cli("ledger", "public-key").strip() == operator.verifier_text()

    # `yoco ledger verify` checks both signatures with the operator's key.
    assert "all match" in _cli("ledger", "verify")

    # The export carries the new note; yoco-verify accepts it with either pinned key,
    # and refuses a stranger's key under the same names.
    out = tmp_path / "log"
    _cli("ledger", "export-log", cid, "--out", str(out))
    assert (out / "checkpoint").read_text() == new_text
    for key in (operator.verifier_text(), new_key):
        code, text = verify(capsys, out, "-k", key)
        assert code == 0, text
    stranger = note.Signer.generate(operator.name)
    code, text = verify(capsys, out, "-k", stranger.verifier_text())
    assert code == 1 and "no signature by a known key" in text, text
    code, text = verify(capsys, out, "-k", stranger.verifier.named(origin).to_text())
    assert code == 1, text
    # The old head's consistency proof to the new one checks with the operator's key.
    old_cp = tmp_path / "old-checkpoint"
    old_cp.write_text(old_text)
    code, text = verify(capsys, out, "-k", operator.verifier_text(), "--since", old_cp)
    assert code == 0, text
    assert "since checkpoint 2: this log of 3 entries extends it" in text, text
