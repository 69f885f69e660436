"""yoco-verify prints stored text (an exclusion's reason) through the one neutraliser: an
escape sequence can neither clear the screen nor draw a fake "OK" over a FAILED line."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from tests import factories as f
from tests.audit.conftest import verify, yoco
from yoco.database import unit_of_work


def test_an_exclusion_reason_with_escapes_is_printed_neutralised(world, seed, app_ctx,
                                                                  capsys) -> None:
    from sqlalchemy import text as sql

    old = world["tmp"] / "log-old"
    yoco("ledger", "export-log", "C-TIP", "--out", str(old))
    with unit_of_work(app_ctx.engine) as s:
        fid = s.execute(sql("SELECT event_id::text FROM failures WHERE contract_id = 'C-TIP' "
                            "AND failure_class = 'unplanned' ORDER BY occurred_at DESC "
                            "LIMIT 1")).scalar_one()
    reason = "maintenance\x1b[2J\x1b[HOK: every check passed and every figure matches\u202e"
    seed([], [f.rec("exclusion", "C-TIP", datetime(2026, 4, 2, tzinfo=UTC),
                    event_id=str(uuid.uuid4()), failure_event_id=fid, reason=reason,
                    approved_by="k.l\u202e")])
    new = world["tmp"] / "log-new"
    yoco("ledger", "export-log", "C-TIP", "--out", str(new))
    code, out = verify(capsys, new, "-k", world["key"], "--since", old / "checkpoint")
    assert code == 0, out
    assert "\x1b" not in out and "\u202e" not in out, repr(out)
    assert ("excluded: maintenance\\u001b[2J\\u001b[HOK: every check passed and every "
            "figure matches\\u202e (approved by k.l\\u202e)") in out, out
