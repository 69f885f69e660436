"""Between two checkpoints: check that the newer log extends the older, list what changed.

The consistency proof from the older size to the newer is computed from the newer
export's tiles and checked (RFC 9162 §2.1.4) against both signed roots.  Then every entry
appended since is listed, and those that change a figure an earlier report may already
have stated are called out: a later outcome of an older failure (a correction), an
exclusion, a reclassification, an amendment, a year-close adjustment, a credit or a void.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from yoco_verify import VerifyError
from yoco_verify.logdir import VerifiedLog
from yoco_verify.replay import Ledger
from yoco_verify.shared.ledger import merkle, note
from yoco_verify.shared.ledger.errors import ProofError

__all__ = ["Change", "FigureChange", "changes_since", "check_consistency", "reported_changes"]


@dataclass(frozen=True, slots=True)
class Change:
    """One appended entry that changes something already reported."""

    seq: int
    kind: str
    message: str


def check_consistency(log: VerifiedLog, old: note.Checkpoint) -> None:
    """Check that ``log`` (verified) extends the older signed checkpoint ``old``."""
    if old.origin != log.origin:
        raise VerifyError(f"older checkpoint: it is of log {old.origin!r}, not {log.origin!r}")
    if old.size > log.size:
        raise VerifyError(
            f"older checkpoint: size {old.size} is larger than the export's {log.size}"
        )
    if old.size == 0:
        return
    proof = log.consistency_proof(old.size)
    try:
        merkle.verify_consistency(old.size, log.size, proof, old.root, log.root)
    except ProofError as exc:
        raise VerifyError(
            f"older checkpoint: the log of size {log.size} does not extend the signed tree "
            f"of size {old.size} ({exc}): the operator rewrote history"
        ) from None


def _failure_month(led: Ledger, fid: str) -> str:
    f = led.failures.get(fid)
    return f.occurred_at.strftime("%Y-%m") if f else "?"


def changes_since(led: Ledger, old_size: int) -> tuple[Counter[str], list[Change]]:
    """The kinds of entries appended after ``old_size``, and the corrections among them."""
    kinds: Counter[str] = Counter()
    changes: list[Change] = []
    by_id = {b.get("event_id"): (s, b) for s, b in enumerate(led.bodies)}
    reported = {str(b.get("month")) for b in led.bodies[:old_size] if b.get("kind") == "report"}
    for seq in range(old_size, led.size):
        b: dict[str, Any] = led.bodies[seq]
        kind = str(b.get("kind"))
        kinds[kind] += 1
        fid = str(b.get("failure_event_id", ""))
        old_failure = fid in by_id and by_id[fid][0] < old_size
        month = _failure_month(led, fid) if fid else ""
        if kind == "outcome" and old_failure:
            prior = [o for o in led.outcomes if o.failure_event_id == fid and o.seq < old_size]
            was = prior[-1].outcome if prior else "pending"
            changes.append(
                Change(
                    seq,
                    kind,
                    f"failure {fid} ({month}): outcome {was} → {b.get('outcome')} "
                    f"(lost_steps {b.get('lost_steps')})",
                )
            )
        elif kind == "exclusion":
            tag = "an already reported" if old_failure else "a new"
            changes.append(
                Change(
                    seq,
                    kind,
                    f"failure {fid} ({month}, {tag} failure) excluded: {b.get('reason')} "
                    f"(approved by {b.get('approved_by')})",
                )
            )
        elif kind == "reclassification":
            changes.append(
                Change(
                    seq,
                    kind,
                    f"failure {fid} ({month}) reclassified {b.get('previous_class')}/"
                    f"{b.get('previous_cause')} → {b.get('failure_class')}/{b.get('cause')}: "
                    f"{b.get('reason')}",
                )
            )
        elif kind == "amendment":
            changes.append(
                Change(
                    seq,
                    kind,
                    f"contract amended ({b.get('amendment_type')}) from "
                    f"{b.get('effective_date')}: {b.get('changes')}",
                )
            )
        elif kind in ("adjustment", "credit", "credit_void"):
            changes.append(Change(seq, kind, f"{kind} for contract year {b.get('year')}"))
        elif kind == "failure":
            f = led.failures.get(str(b.get("event_id")))
            if f is not None and f.occurred_at.strftime("%Y-%m") in reported:
                changes.append(
                    Change(
                        seq,
                        kind,
                        f"late failure {f.event_id} dated {f.occurred_at.isoformat()}: its "
                        "month was already reported",
                    )
                )
    return kinds, changes


@dataclass(frozen=True, slots=True)
class FigureChange:
    """A figure of an issued report that the entries appended since would now change."""

    month: str
    report_size: int
    figure: str
    period: str
    was: str
    now: str


def reported_changes(led: Ledger, old_size: int) -> list[FigureChange]:
    """For each month reported under the older checkpoint (its latest ``report`` entry),
    the figures that differ when recomputed over the whole newer log, as of the same
    instant (so only the entries appended since can make a difference)."""
    from yoco_verify.figures import recompute

    latest: dict[str, dict[str, Any]] = {}
    for b in led.bodies[:old_size]:
        if b.get("kind") == "report" and b.get("report") == "monthly-sla":
            latest[str(b.get("month"))] = b
    out: list[FigureChange] = []
    for month, b in sorted(latest.items()):
        size = int(b["checkpoint_tree_size"])
        block = {"month": month, "as_of": b["occurred_at"]}
        try:
            before = recompute(led.prefix(size), block)
            after = recompute(led, block)
        except (VerifyError, ValueError):
            continue  # a month outside the contract's term, say: nothing to compare
        for rid, (m0, y0) in before.rows.items():
            m1, y1 = after.rows.get(rid, ("", ""))
            for period, was, now in (("month", m0, m1), ("year to date", y0, y1)):
                if was != now:
                    out.append(FigureChange(month, size, rid, period, was, now))
    return out
