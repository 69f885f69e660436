"""Whether a signed checkpoint meets its contract's witness policy (``terms.witnesses``).

The policy itself (which witnesses, k of n) is :class:`ledger.cosign.WitnessPolicy`; the
rule for which policy governs a checkpoint is :func:`billing.inforce.witness_policy_at`
(the contract as amended by the amendments *under* that checkpoint, in log order). Here
they meet the database: the stored cosignatures (``checkpoint_cosignatures``) are put on
the checkpoint's note and every line is verified against the policy's keys, so a forged
or misfiled row never counts. Cosignatures are append-only and a checkpoint's policy is
read from its own entries, so once a checkpoint meets its policy it always does: a report
issued over it says so for good.

Used by the reports (a report states the status of the checkpoint it rests on; an issued
report of a contract with a policy rests only on a checkpoint that meets it) and the
portal. Reads only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.inforce import witness_policy_at
from billing.models import Amendment
from ledger.contracts import get_contract
from ledger.cosign import CosignerKey, PolicyCheck, WitnessPolicy
from ledger.models import Checkpoint, CheckpointCosignature, Contract
from ledger.witnessing import cosigned_note, cosigned_notes

__all__ = [
    "MAX_CANDIDATES",
    "PolicyReach",
    "WitnessStatus",
    "checkpoint_status",
    "checkpoint_statuses",
    "latest_witnessed",
    "policy_at",
    "policy_reach",
    "unreached_policies",
]

#: How many of the newest checkpoints with enough cosignature rows
#: :func:`latest_witnessed` verifies before giving up (each costs one Ed25519 check per
#: cosignature; the newest that carries the quorum is nearly always the first).
MAX_CANDIDATES = 50


@dataclass(frozen=True, slots=True)
class WitnessStatus:
    """A checkpoint against its contract's witness policy: the policy (None: the contract
    has none) and what the checkpoint's cosignatures show (None without a policy)."""

    tree_size: int
    policy: WitnessPolicy | None
    check: PolicyCheck | None

    @property
    def met(self) -> bool:
        """True when the contract has no policy or the checkpoint meets it."""
        return self.check is None or self.check.met

    @property
    def label(self) -> str:
        """A short label for a table cell: ``witnessed``, ``not yet witnessed`` or
        ``no witness policy``."""
        if self.check is None:
            return "no witness policy"
        return "witnessed" if self.check.met else "not yet witnessed"

    def words(self) -> str:
        """One sentence for a page: the policy, and whether (and how) the checkpoint meets
        it; names the missing witnesses when it does not."""
        if self.policy is None or self.check is None:
            return (f"Checkpoint {self.tree_size}: the contract's terms name no witness "
                    "policy; the checkpoint rests on the operator's signature alone.")
        if self.check.met:
            return (f"Checkpoint {self.tree_size} meets the contract's witness policy "
                    f"({self.policy.describe()}): it carries valid cosignatures of at least "
                    f"{self.policy.quorum} of them.")
        return (f"Checkpoint {self.tree_size} does not meet the contract's witness policy "
                f"yet ({self.policy.describe()}): {self.check.words()}.")


def _amendments(session: Session, contract_id: str) -> list[Amendment]:
    return list(session.execute(
        select(Amendment).where(Amendment.contract_id == contract_id).order_by(Amendment.seq)
    ).scalars())


def policy_at(session: Session, contract_id: str, tree_size: int) -> WitnessPolicy | None:
    """The witness policy the checkpoint of ``tree_size`` entries of ``contract_id``'s log
    must meet (:func:`billing.inforce.witness_policy_at`); None when it has none. Raises
    :class:`~ledger.errors.UnknownContract` for an unknown contract."""
    return witness_policy_at(get_contract(session, contract_id),
                             _amendments(session, contract_id), tree_size)


def checkpoint_status(session: Session, cp: Checkpoint) -> WitnessStatus:
    """Whether ``cp`` (a checkpoint of a contract's log) meets the contract's policy,
    verifying every stored cosignature line over the checkpoint's own note."""
    policy = policy_at(session, cp.log_id, cp.tree_size)
    if policy is None:
        return WitnessStatus(cp.tree_size, None, None)
    return WitnessStatus(cp.tree_size, policy, policy.check(cosigned_note(session, cp)))


def checkpoint_statuses(
    session: Session, contract_id: str, cps: Sequence[Checkpoint]
) -> list[WitnessStatus]:
    """:func:`checkpoint_status` of each of ``cps`` (all of ``contract_id``'s log), in
    their order, with one query for the contract's amendments and one for the
    cosignatures."""
    if not cps:
        return []
    base = get_contract(session, contract_id)
    rows = _amendments(session, contract_id)
    policies = [witness_policy_at(base, rows, cp.tree_size) for cp in cps]
    if all(p is None for p in policies):
        return [WitnessStatus(cp.tree_size, None, None) for cp in cps]
    notes = cosigned_notes(session, cps)
    return [
        WitnessStatus(cp.tree_size, p, p.check(n) if p is not None else None)
        for cp, p, n in zip(cps, policies, notes, strict=True)
    ]


def latest_witnessed(
    session: Session, contract_id: str, *, signed_after: datetime | None = None
) -> tuple[Checkpoint | None, WitnessStatus | None]:
    """The newest checkpoint of ``contract_id``'s log that meets the contract's witness
    policy (signed after ``signed_after``, when given), with its status; ``(None, None)``
    when none does among the newest :data:`MAX_CANDIDATES` that hold enough cosignature
    rows. Without a policy at a checkpoint, that checkpoint meets it."""
    have = (
        select(CheckpointCosignature.tree_size, func.count().label("n"))
        .where(CheckpointCosignature.log_id == contract_id)
        .group_by(CheckpointCosignature.tree_size).subquery()
    )
    query = (
        select(Checkpoint, func.coalesce(have.c.n, 0))
        .outerjoin(have, have.c.tree_size == Checkpoint.tree_size)
        .where(Checkpoint.log_id == contract_id)
        .order_by(Checkpoint.tree_size.desc())
    )
    if signed_after is not None:
        query = query.where(Checkpoint.signed_at > signed_after)
    base = get_contract(session, contract_id)
    rows = _amendments(session, contract_id)
    # The smallest quorum any checkpoint of this log can be held to (0 where some has no
    # policy): checkpoints with fewer cosignature rows are skipped in the database.
    least = min(
        (p.quorum if p is not None else 0)
        for p in [witness_policy_at(base, rows, size)
                  for size in (0, *(r.seq + 1 for r in rows))]
    )
    query = query.where(func.coalesce(have.c.n, 0) >= least)
    tried = 0
    for cp, count in session.execute(query).all():
        policy = witness_policy_at(base, rows, cp.tree_size)
        if policy is None:
            return cp, WitnessStatus(cp.tree_size, None, None)
        if count < policy.quorum:
            continue  # too few rows to meet it: no signature to check
        status = WitnessStatus(cp.tree_size, policy, policy.check(cosigned_note(session, cp)))
        if status.met:
            return cp, status
        tried += 1
        if tried >= MAX_CANDIDATES:
            break
    return None, None


#: A tree size beyond every log's: the policy "at" it is the one in force now, after
#: every amendment recorded (it governs the next checkpoint signed).
_NOW = 2**62


@dataclass(frozen=True, slots=True)
class PolicyReach:
    """A contract's witness policy in force against the witnesses this ledger submits its
    checkpoints to (``YOCO_WITNESSES``): the policy's witnesses the ledger never asks
    (``unconfigured``, by name, in the policy's order; a witness configured under another
    key counts as not configured, its cosignatures would not verify)."""

    contract_id: str
    policy: WitnessPolicy
    unconfigured: tuple[str, ...]

    @property
    def configured(self) -> int:
        """How many of the policy's witnesses the ledger submits checkpoints to."""
        return len(self.policy.keys) - len(self.unconfigured)

    @property
    def can_be_met(self) -> bool:
        """Whether the configured witnesses alone can reach the policy's quorum."""
        return self.configured >= self.policy.quorum

    def words(self) -> str:
        """One sentence naming the witnesses the ledger never asks and what follows."""
        names = ", ".join(self.unconfigured)
        head = (f"contract {self.contract_id}: its witness policy ({self.policy.describe()}) "
                f"names {names}, not among the witnesses this ledger submits checkpoints "
                "to (YOCO_WITNESSES)")
        if self.can_be_met:
            return (f"{head}; the policy can still be met by the {self.configured} "
                    "configured one(s), but never with a cosignature of "
                    f"{'that witness' if len(self.unconfigured) == 1 else 'those'}")
        return (f"{head}: only {self.configured} of the {self.policy.quorum} cosignatures "
                "it needs can ever be collected, so its checkpoints stay 'not yet "
                "witnessed' and its reports cannot be issued until YOCO_WITNESSES names "
                "enough of them")


def policy_reach(
    contract_id: str, policy: WitnessPolicy, configured: Iterable[CosignerKey]
) -> PolicyReach:
    """``policy`` (``contract_id``'s) against the ``configured`` witnesses' keys."""
    known = {k.to_text() for k in configured}
    return PolicyReach(contract_id, policy,
                       tuple(k.name for k in policy.keys if k.to_text() not in known))


def unreached_policies(
    session: Session, configured: Iterable[CosignerKey],
    contract_ids: Iterable[str] | None = None,
) -> list[PolicyReach]:
    """The contracts (all, or ``contract_ids``) whose witness policy in force now (the one
    the next checkpoint must meet) names a witness not among ``configured``, by contract
    id. Reads the contracts' terms and the amendments that change a policy in one query
    each, then the policy of each contract that has or had one."""
    keys = list(configured)
    wanted = None if contract_ids is None else set(contract_ids)
    rows = session.execute(select(Contract.contract_id, Contract.terms)).all()
    candidates = {cid for cid, terms in rows if isinstance(terms, dict) and "witnesses" in terms}
    amended = session.execute(
        select(Amendment.contract_id)
        .where(Amendment.changes["terms"].has_key("witnesses"))
    ).scalars()
    candidates.update(amended)
    if wanted is not None:
        candidates &= wanted
    out = []
    for cid in sorted(candidates):
        policy = policy_at(session, cid, _NOW)
        if policy is None:
            continue
        reach = policy_reach(cid, policy, keys)
        if reach.unconfigured:
            out.append(reach)
    return out
