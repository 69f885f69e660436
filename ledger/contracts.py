"""Contracts as journal entries: the terms every figure is computed with are in the log.

A contract entry is the first entry of the contract's own log.  Its event id
is derived from the contract id (UUID v5), so importing the same contract
twice is a no-op, and importing different content under the same id is
refused (amendments are entries of their own).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import false, select
from sqlalchemy.orm import Session

from ledger import ids, journal, projections
from ledger.canonical import canonical_bytes
from ledger.errors import IngestRefused, UnknownContract, ensure
from ledger.models import Contract, LedgerLog
from ledger.records import ContractSpec, RecordError, contract_from_record

CONTRACT_NAMESPACE = uuid.UUID("5b0d3c1e-8f0a-4e59-9a43-0c9a1f3b7d21")


def contract_event_id(contract_id: str) -> uuid.UUID:
    """The fixed event id of a contract's creation entry."""
    return ids.derived_id(CONTRACT_NAMESPACE, f"contract:{contract_id}")


def contract_entry(spec: ContractSpec) -> journal.NewEntry:
    """The journal entry that creates contract ``spec``."""
    event_id = contract_event_id(spec.contract_id)
    body = {
        "kind": "contract",
        "event_id": str(event_id),
        "contract_id": spec.contract_id,
        "contract": spec.to_record(),
    }
    canonical = canonical_bytes(body)
    return journal.NewEntry(
        kind="contract",
        event_id=event_id,
        contract_id=spec.contract_id,
        occurred_at=None,
        canonical=canonical,
        body=journal.entry_body(canonical),
    )


@dataclass(frozen=True, slots=True)
class AddResult:
    """Contracts created and contracts that already existed identically."""

    created: list[str]
    unchanged: list[str]


def add_contracts(
    session: Session, specs: Sequence[ContractSpec], where: Sequence[str] | None = None
) -> AddResult:
    """Record ``specs`` as contract entries; all or nothing.  Never commits.

    ``where`` names each spec's position (``line 3`` or ``[2]``) for errors.
    """
    errors: list[RecordError] = []
    seen: set[str] = set()
    entries: list[journal.NewEntry] = []
    for i, spec in enumerate(specs):
        if spec.contract_id in seen:
            errors.append(_err(where, i, f"contract {spec.contract_id!r} appears twice"))
            continue
        seen.add(spec.contract_id)
        entries.append(contract_entry(spec))
    if errors:
        raise IngestRefused(errors, "contracts")
    sizes = journal.lock_logs(session, (e.contract_id for e in entries))
    existing = journal.find_existing(session, (e.event_id for e in entries))
    fresh: list[journal.NewEntry] = []
    unchanged: list[str] = []
    for i, entry in enumerate(entries):
        old = existing.get(entry.event_id)
        if old is None:
            fresh.append(entry)
        elif old.canonical == entry.canonical:
            unchanged.append(entry.contract_id)
        else:
            errors.append(
                _err(
                    where,
                    i,
                    f"contract {entry.contract_id!r} already exists with different content; "
                    "change a contract with an amendment, not a new contract",
                )
            )
    if errors:
        raise IngestRefused(errors, "contracts")
    stored = journal.append_entries(session, fresh, sizes)
    problems = projections.project(
        session,
        [
            projections.ProjectedEntry(s.log_id, s.seq, s.event_id, s.kind, None, e.body)
            for e, s in zip(fresh, stored, strict=True)
        ],
    )
    ensure(not problems, f"contract entries do not match their projection: {problems}")
    return AddResult(created=[e.contract_id for e in fresh], unchanged=unchanged)


def _err(where: Sequence[str] | None, i: int, message: str) -> RecordError:
    if where is not None:
        return RecordError(f"{where[i]}: {message}", field="contract_id")
    return RecordError(message, field="contract_id", index=i)


def get_contract(session: Session, contract_id: str) -> ContractSpec:
    """The contract ``contract_id`` as recorded; :class:`UnknownContract` when there is none."""
    row = session.execute(
        select(Contract).where(Contract.contract_id == contract_id)
    ).scalar_one_or_none()
    if row is None:
        raise UnknownContract(f"unknown contract {contract_id!r}")
    body = session.execute(
        select(journal.JournalEntry.body).where(journal.JournalEntry.event_id == row.event_id)
    ).scalar_one()
    return contract_from_record(body["contract"])


def list_contracts(session: Session) -> list[Contract]:
    """Every contract, by id."""
    return list(session.execute(select(Contract).order_by(Contract.contract_id)).scalars())


# --------------------------------------------------------------------------- tenant reads


@dataclass(frozen=True, slots=True)
class TenantScope:
    """Whose contracts a read may return: one customer's, or every customer's.

    Every tenant-scoped read below takes one, so the customer filter is in the query
    itself (row-level security, under which the portal's sessions run, is the other
    half).  ``everyone``: staff, who see every contract; otherwise only the contracts of
    ``customer`` -- and none at all when ``customer`` is empty (a caller bound to no
    customer sees nothing, never everything).
    """

    customer: str = ""
    everyone: bool = False


def _within(scope: TenantScope, query: Any) -> Any:
    """``query`` (over :class:`Contract`) narrowed to ``scope``."""
    if scope.everyone:
        return query
    if not scope.customer:
        return query.where(false())
    return query.where(Contract.customer == scope.customer)


def visible_contracts(session: Session, scope: TenantScope) -> list[Contract]:
    """The contracts of ``scope``, by id."""
    q = _within(scope, select(Contract).order_by(Contract.contract_id))
    return list(session.execute(q).scalars())


def contract_page(
    session: Session, scope: TenantScope, after: str | None, limit: int
) -> list[tuple[str, int]]:
    """The first ``limit`` contracts of ``scope`` with an id after ``after`` (from the
    first when None), by id, each with the size of its log (0: no entry yet): a page of
    keyset pagination."""
    q = (
        select(Contract.contract_id, LedgerLog.size)
        .outerjoin(LedgerLog, LedgerLog.log_id == Contract.contract_id)
        .order_by(Contract.contract_id)
        .limit(limit)
    )
    if after is not None:
        q = q.where(Contract.contract_id > after)
    q = _within(scope, q)
    return [(str(cid), int(size or 0)) for cid, size in session.execute(q)]


def visible_log_size(session: Session, scope: TenantScope, contract_id: str) -> int | None:
    """The size of contract ``contract_id``'s log (0: no entry yet) when the contract is
    in ``scope``; None when it is not -- the same answer for another customer's contract
    as for one that does not exist.  One indexed query."""
    q = _within(
        scope,
        select(Contract.contract_id, LedgerLog.size)
        .outerjoin(LedgerLog, LedgerLog.log_id == Contract.contract_id)
        .where(Contract.contract_id == contract_id),
    )
    row = session.execute(q).first()
    return None if row is None else int(row[1] or 0)


def customer_has_contracts(session: Session, customer: str) -> bool:
    """True when at least one contract belongs to ``customer``."""
    q = select(Contract.contract_id).where(Contract.customer == customer).limit(1)
    return session.execute(q).first() is not None


def contract_ids_of(session: Session, customer: str) -> list[str]:
    """The ids of ``customer``'s contracts, sorted."""
    q = (
        select(Contract.contract_id)
        .where(Contract.customer == customer)
        .order_by(Contract.contract_id)
    )
    return list(session.execute(q).scalars())


def existing_contract_ids(session: Session, contract_ids: Collection[str]) -> set[str]:
    """Those of ``contract_ids`` that name a recorded contract (that the session sees)."""
    q = select(Contract.contract_id).where(Contract.contract_id.in_(list(contract_ids)))
    return set(session.execute(q).scalars())
