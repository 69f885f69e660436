"""Failures of one incident shown together on the failures page (billing.incidents)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from billing.incidents import INCIDENT_GAP, group_incidents
from tests import factories as fx


@dataclass(frozen=True)
class F:
    event_id: str
    occurred_at: datetime
    cause: str


def test_group_incidents() -> None:
    t = fx.T0
    fs = [F("a", t, "node_power"), F("x", t + timedelta(minutes=1), "gpu_lost"),
          F("b", t + timedelta(minutes=14), "node_power"),
          F("c", t + timedelta(minutes=29), "node_power"),  # 15 min after b: still one
          F("d", t + timedelta(minutes=45), "node_power"),  # 16 min after c: alone
          F("y", t + timedelta(hours=3), "gpu_lost")]
    got = group_incidents(list(reversed(fs)))
    assert set(got) == {"a", "b", "c"}  # alone: no incident
    inc = got["a"]
    assert inc is got["c"] and inc.event_ids == ("a", "b", "c") and inc.size == 3
    assert (inc.number, inc.cause, inc.first, inc.last) == (1, "node_power", t,
                                                           t + timedelta(minutes=29))
    assert group_incidents([]) == {}
    with pytest.raises(ValueError, match="gap"):
        group_incidents(fs, -INCIDENT_GAP)


def test_the_failures_page_shows_an_incident_together(seeded, client_for) -> None:
    from ledger.checkpoints import sign_all
    from ledger.ingest import ingest
    from ledger.records import validate_batch
    from yoco.database import unit_of_work

    ctx, _ = seeded
    at = fx.T0 + timedelta(days=140)
    recs = [fx.rec("job_started", "C-A", at, job_id=j, gpus=8) for j in ("j2", "j3", "j4")]
    ids = []
    # a node losing power: three jobs interrupted within 8 minutes; a gpu_lost in between
    for n, (job, cause, minutes) in enumerate([("j2", "node_power", 10), ("j3", "gpu_lost", 12),
                                               ("j3", "node_power", 14), ("j4", "node_power", 18),
                                               ("j2", "node_power", 300)]):
        f = fx.rec("failure", "C-A", at + timedelta(minutes=minutes), job_id=job,
                   failure_class="unplanned", cause=cause, node="node-9", gpu=n, step=n + 1)
        recs.append(f)
        ids.append(f["event_id"])
    records, errors = validate_batch(recs)
    assert not errors
    with unit_of_work(ctx.engine) as s:
        ingest(s, records, None, ctx.projectors)
        sign_all(s, ctx.signer, ctx.settings.log_origin)
    html = client_for("a").get("/contracts/C-A/failures?year=1").text
    heads = re.findall(r'data-test="incident">(.*?)</tr>', html, re.S)
    assert len(heads) == 1, heads
    text = " ".join(re.sub(r"<[^>]+>", " ", heads[0]).split())
    assert text.startswith("Incident: 3 failures of one cause (node power) from")
    assert "each within 15 minutes of the one before" in text
    # its three failures follow the heading, one after another, newest first
    body = html.split('data-test="incident"', 1)[1]
    rows = re.findall(r'<tr( class="in-incident")?>\s*<td data-label="When"><a href="[^"]*/'
                      r'failures/([0-9a-f-]+)"', body)
    assert [(bool(c), fid) for c, fid in rows[:4]] == [
        (True, ids[3]), (True, ids[2]), (True, ids[0]), (False, ids[1])]
