"""Alerts of the witnesses (docs/alerts.md): ``witness_down`` and ``witness_refused``.

Raised by the checkpoint scheduler after each submission run
(:func:`ledger.witnessing.submit_pending`):

* ``witness_down`` — a witness could not be reached: the checkpoints stay uncosigned by it
  until it answers again (ingest and signing go on). Keyed by the witness and the time of
  its last stored cosignature, so one outage is alerted once, and the next outage again.
* ``witness_refused`` — a witness refused to cosign a log's head (HTTP status and its
  words): the log is not consistent with what the witness cosigned before, or the key or
  the configuration differ. Keyed by witness, log and size.
* ``checkpoint_cosigned`` — a contract log's head reached the witness quorum (for a
  contract whose terms name a witness policy, that policy: ``terms.witnesses``): the event's
  data holds the cosigned checkpoint note, so a customer whose webhook asks for this kind
  (opt-in) holds every cosigned head even without running a witness. Keyed by log and
  size.
* ``witness_policy_unmet`` — a contract's witness policy in force names witnesses the
  ledger never submits to (not in ``YOCO_WITNESSES``) and the configured ones alone cannot
  reach its quorum: its checkpoints stay "not yet witnessed" and its reports cannot be
  issued. Raised by the checkpoint runs and by importing or amending a contract; keyed by
  contract and the witnesses missing, so a policy or configuration that changes which
  are missing is alerted again. An operator's alert (no contract attached: the fix is the
  ledger's configuration, not the customer's).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from alerts.events import NewEvent, raise_event
from billing.witness_policy import PolicyReach, policy_at
from ledger.contracts import list_contracts
from ledger.models import Checkpoint
from ledger.witnessing import SubmitRun, WitnessEndpoint, cosigned_note, cosigners_of

__all__ = [
    "cosigned_events",
    "policy_events",
    "raise_policy_alerts",
    "raise_witness_alerts",
    "witness_events",
]


def witness_events(session: Session, run: SubmitRun, now: datetime) -> list[NewEvent]:
    """The events of one submission run (not stored)."""
    contracts = {c.contract_id for c in list_contracts(session)}
    out = []
    for name, (error, last_ok) in sorted(run.down.items()):
        since = last_ok.astimezone(UTC).isoformat() if last_ok else "never"
        out.append(NewEvent(
            kind="witness_down",
            key=f"witness_down:{name}:{since}",
            occurred_at=now,
            subject=f"witness {name} cannot be reached: checkpoints wait for its "
                    f"cosignature (last cosignature: {since}); {error}",
            data={"witness": name, "error": error, "last_cosigned_at": last_ok and since},
        ))
    for r in run.refused:
        out.append(NewEvent(
            kind="witness_refused",
            key=f"witness_refused:{r.witness}:{r.log_id}:{r.tree_size}",
            occurred_at=now,
            contract_id=r.log_id if r.log_id in contracts else None,
            subject=f"witness {r.witness} refused to cosign log {r.log_id} at size "
                    f"{r.tree_size} (HTTP {r.status}): {r.message}",
            data={"witness": r.witness, "log_id": r.log_id, "tree_size": r.tree_size,
                  "status": r.status, "message": r.message},
        ))
    return out


def cosigned_events(
    session: Session, run: SubmitRun, witnesses: list[WitnessEndpoint], quorum: int,
    now: datetime,
) -> list[NewEvent]:
    """A ``checkpoint_cosigned`` event for each contract head this run cosigned that now
    meets the contract's witness policy (``terms.witnesses``) or, for a contract without
    one, carries ``quorum`` cosignatures of the configured ``witnesses``."""
    contracts = {c.contract_id for c in list_contracts(session)}
    known = {w.key.to_text() for w in witnesses}
    out = []
    for log_id, size in sorted({(log_id, size) for _, log_id, size in run.cosigned}):
        if log_id not in contracts:
            continue
        cp = session.execute(select(Checkpoint).where(
            Checkpoint.log_id == log_id, Checkpoint.tree_size == size)).scalar_one()
        policy = policy_at(session, log_id, size)
        if policy is not None:
            check = policy.check(cosigned_note(session, cp))
            if not check.met:
                continue
            names = [k.to_text() for k in policy.keys if k.name in check.cosigned]
        else:
            names = [w for w, _ in cosigners_of(session, log_id, size) if w in known]
            if len(names) < max(quorum, 1):
                continue
        out.append(NewEvent(
            kind="checkpoint_cosigned",
            key=f"checkpoint_cosigned:{log_id}:{size}",
            occurred_at=now,
            contract_id=log_id,
            subject=f"ledger log {log_id}: checkpoint of size {size} cosigned by "
                    f"{len(names)} witness(es)",
            data={"log_id": log_id, "origin": cp.origin, "tree_size": size,
                  "root_hash": bytes(cp.root_hash).hex(), "note": cosigned_note(session, cp),
                  "witnesses": sorted(names)},
        ))
    return out


def raise_witness_alerts(
    session: Session, run: SubmitRun, now: datetime | None = None, *,
    witnesses: list[WitnessEndpoint] | None = None, quorum: int = 0,
) -> list[str]:
    """Store the events of ``run`` (once per key) — and, given the configured
    ``witnesses`` and ``quorum``, the ``checkpoint_cosigned`` heads; return the keys
    raised now. Never commits."""
    now = now or datetime.now(UTC)
    events = witness_events(session, run, now)
    if witnesses:
        events += cosigned_events(session, run, witnesses, quorum, now)
    return [e.key for e in events if raise_event(session, e) is not None]


def policy_events(reaches: list[PolicyReach], now: datetime) -> list[NewEvent]:
    """A ``witness_policy_unmet`` event for each of ``reaches`` whose policy the configured
    witnesses cannot meet (not stored)."""
    return [
        NewEvent(
            kind="witness_policy_unmet",
            key=f"witness_policy_unmet:{r.contract_id}:{','.join(sorted(r.unconfigured))}",
            occurred_at=now,
            subject=r.words(),
            data={"contract_id": r.contract_id, "policy": r.policy.to_json(),
                  "unconfigured": list(r.unconfigured), "configured": r.configured},
        )
        for r in reaches if not r.can_be_met
    ]


def raise_policy_alerts(
    session: Session, reaches: list[PolicyReach], now: datetime | None = None
) -> list[str]:
    """Store the ``witness_policy_unmet`` events of ``reaches`` (once per key); return the
    keys raised now. Never commits."""
    events = policy_events(reaches, now or datetime.now(UTC))
    return [e.key for e in events if raise_event(session, e) is not None]
