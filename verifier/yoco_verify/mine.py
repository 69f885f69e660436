"""Compare the customer's own failure observations with the log (``yoco-verify --mine``).

An inclusion proof cannot show that a failure was never recorded; the customer's own
runtime logs can.  The observations file is CSV with a header line; ``#`` starts a
comment line.  Columns (any order; ``job``, ``start``, ``end`` required):

=============  ==============================================================
``job``        the job id, as the runtime reports it to the ledger
``start``      ISO 8601 with offset: the earliest the failure can have happened
``end``        ISO 8601 with offset: the latest (inclusive)
``node``       optional: the node the failure hit
``gpu``        optional: the GPU index
``outcome``    optional: what the customer saw: live_migrated, rolled_back, failed
``lost_steps`` optional: the steps the customer saw lost (integer)
=============  ==============================================================

A logged failure *matches* an observation when its job is the observation's, its
``occurred_at`` is inside ``[start, end]``, and its node and GPU equal the observation's
wherever both give one.  Each logged failure matches at most one observation (the
earliest unmatched one it fits, in file order).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from yoco_verify import VerifyError
from yoco_verify.replay import Ledger
from yoco_verify.shared.billing import sla

__all__ = ["Finding", "Observation", "compare", "read_observations"]

_OUTCOMES = ("live_migrated", "rolled_back", "failed")


@dataclass(frozen=True, slots=True)
class Observation:
    """One failure the customer observed."""

    line: int
    job: str
    start: datetime
    end: datetime
    node: str | None
    gpu: int | None
    outcome: str | None
    lost_steps: int | None


@dataclass(frozen=True, slots=True)
class Finding:
    """``missing`` (no logged failure matches) or ``contradicts`` (the outcome differs)."""

    kind: str
    observation: Observation
    message: str


def _time(value: str, line: int, name: str) -> datetime:
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise VerifyError(f"mine: line {line}, {name}: {value!r} is not ISO 8601") from None
    if t.tzinfo is None:
        raise VerifyError(f"mine: line {line}, {name}: {value!r} has no time zone offset")
    return t


def read_observations(path: Path) -> list[Observation]:
    """Parse the observations file; :class:`VerifyError` names the line and the field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VerifyError(f"mine: cannot read {path}: {exc}") from None
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    lines = [(i, ln) for i, ln in lines if not ln.lstrip().startswith("#")]
    if not lines:
        raise VerifyError("mine: the file has no header line")
    header_line = lines[0][0]
    reader = csv.reader(io.StringIO("\n".join(ln for _, ln in lines)))
    rows = list(reader)
    cols = [c.strip() for c in rows[0]]
    for need in ("job", "start", "end"):
        if need not in cols:
            raise VerifyError(f"mine: line {header_line}: the header has no {need!r} column")
    unknown = set(cols) - {"job", "start", "end", "node", "gpu", "outcome", "lost_steps"}
    if unknown:
        raise VerifyError(f"mine: line {header_line}: unknown column(s) {sorted(unknown)}")
    out = []
    for (line, _), row in zip(lines[1:], rows[1:], strict=True):
        if len(row) != len(cols):
            raise VerifyError(f"mine: line {line}: {len(row)} fields, the header has {len(cols)}")
        r = {c: v.strip() for c, v in zip(cols, row, strict=True)}
        if not r["job"]:
            raise VerifyError(f"mine: line {line}, job: empty")
        start, end = _time(r["start"], line, "start"), _time(r["end"], line, "end")
        if end < start:
            raise VerifyError(f"mine: line {line}, end: before start")
        gpu = lost = None
        try:
            if r.get("gpu"):
                gpu = int(r["gpu"])
            if r.get("lost_steps"):
                lost = int(r["lost_steps"])
        except ValueError:
            raise VerifyError(f"mine: line {line}, gpu/lost_steps: not an integer") from None
        outcome = r.get("outcome") or None
        if outcome is not None and outcome not in _OUTCOMES:
            raise VerifyError(f"mine: line {line}, outcome: expected one of {list(_OUTCOMES)}")
        out.append(
            Observation(line, r["job"], start, end, r.get("node") or None, gpu, outcome, lost)
        )
    return out


def compare(led: Ledger, observations: list[Observation]) -> list[Finding]:
    """Observations with no matching logged failure, and matched ones whose latest outcome
    in the log contradicts what the customer saw."""
    latest = sla.latest_outcomes(led.outcomes)
    used: set[str] = set()
    findings: list[Finding] = []
    failures = sorted(led.failures.values(), key=lambda f: (f.occurred_at, f.seq))
    for ob in observations:
        match = None
        for f in failures:
            if f.event_id in used or f.job_id != ob.job:
                continue
            if not ob.start <= f.occurred_at <= ob.end:
                continue
            body = led.failure_bodies[f.event_id]
            if ob.node is not None and body.get("node") not in (None, ob.node):
                continue
            if ob.gpu is not None and body.get("gpu") not in (None, ob.gpu):
                continue
            match = f
            break
        where = f"line {ob.line}: job {ob.job}, {ob.start.isoformat()} to {ob.end.isoformat()}"
        if ob.node:
            where += f", node {ob.node}"
        if ob.gpu is not None:
            where += f", GPU {ob.gpu}"
        if match is None:
            findings.append(Finding("missing", ob, f"{where}: no failure in the log matches"))
            continue
        used.add(match.event_id)
        o = latest.get(match.event_id)
        logged = o.outcome if o else "pending"
        if ob.outcome is not None and ob.outcome != logged:
            findings.append(
                Finding(
                    "contradicts",
                    ob,
                    f"{where}: you saw {ob.outcome}, the log's latest outcome of failure "
                    f"{match.event_id} (entry {match.seq}) is {logged}",
                )
            )
        elif ob.lost_steps is not None and o is not None and ob.lost_steps != o.lost_steps:
            findings.append(
                Finding(
                    "contradicts",
                    ob,
                    f"{where}: you saw {ob.lost_steps} lost steps, the log records "
                    f"{o.lost_steps} for failure {match.event_id} (entry {match.seq})",
                )
            )
    return findings
