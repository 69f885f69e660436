# A copy of billing/inforce.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""The contract in force for a contract year, from the contract and its amendments (pure).

One home of the amendment rule, used by :mod:`billing.amendments` (over the database's
amendment rows) and by the standalone verifier (over the amendment entries of an exported
log): a contract year is computed with the contract as amended by every amendment in
force at the year's first day (``effective_date <=`` the year's start date); an amendment
with ``applies_to_year_in_progress`` also governs the year that contains its effective
date.  A renewal extends the term (``term_years``, the largest recorded).  Amendments
apply in order of effective date, then log order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from yoco_verify.shared.billing.terms import Terms
from yoco_verify.shared.billing.years import contract_year_dates
from yoco_verify.shared.ledger.cosign import WitnessPolicy
from yoco_verify.shared.ledger.records import ContractSpec, contract_from_record

__all__ = [
    "AmendmentLike",
    "InForce",
    "applies",
    "in_force",
    "merge_changes",
    "term_years_of",
    "witness_policy_at",
]


class AmendmentLike(Protocol):
    """What the rule reads of an amendment (a database row or a replayed entry)."""

    @property
    def event_id(self) -> Any: ...
    @property
    def seq(self) -> int: ...
    @property
    def effective_date(self) -> date: ...
    @property
    def applies_to_year_in_progress(self) -> bool: ...
    @property
    def changes(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class InForce:
    """A contract as amended for one year: the spec, its terms, which amendments apply."""

    contract: ContractSpec
    terms: Terms
    amendments: tuple[str, ...]
    term_years: int


def merge_changes(record: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` (a contract record) with ``changes`` applied; ``terms`` keys merge."""
    out = dict(record)
    for key, value in changes.items():
        if key == "terms":
            terms = dict(out.get("terms") or {})
            terms.update(value)
            out["terms"] = terms
        else:
            out[key] = value
    return out


def term_years_of(base: ContractSpec, amendments: Sequence[AmendmentLike]) -> int:
    """The term as extended by every renewal recorded (the largest ``term_years``)."""
    term = base.term_years
    for row in sorted(amendments, key=lambda r: r.seq):
        if "term_years" in row.changes:
            term = max(term, int(row.changes["term_years"]))
    return term


def applies(row: AmendmentLike, year_start: date, year_end: date) -> bool:
    """Whether amendment ``row`` governs the contract year ``[year_start, year_end)``."""
    if row.effective_date <= year_start:
        return True
    return bool(row.applies_to_year_in_progress) and row.effective_date < year_end


def in_force(base: ContractSpec, amendments: Sequence[AmendmentLike], year: int) -> InForce:
    """The contract ``base`` as amended for contract year ``year`` by ``amendments``.

    With no amendments, the contract as recorded.  ``amendments`` are taken in order of
    effective date, then ``seq``.
    """
    if not amendments:
        return InForce(
            contract=base,
            terms=Terms.from_json(base.to_record().get("terms")),
            amendments=(),
            term_years=base.term_years,
        )
    rows = sorted(amendments, key=lambda r: (r.effective_date, r.seq))
    start, end = contract_year_dates(base.start_date, max(year, 1))
    record = base.to_record()
    used: list[str] = []
    for row in rows:
        if applies(row, start, end):
            record = merge_changes(record, row.changes)
            used.append(str(row.event_id))
    term = term_years_of(base, rows)
    record["term_years"] = term
    return InForce(
        contract=contract_from_record(record),
        terms=Terms.from_json(record.get("terms")),
        amendments=tuple(used),
        term_years=term,
    )


def witness_policy_at(
    base: ContractSpec, amendments: Sequence[AmendmentLike], tree_size: int
) -> WitnessPolicy | None:
    """The witness policy a checkpoint of ``tree_size`` entries of the contract's log must
    meet: the contract's ``terms.witnesses`` as changed by every amendment among those
    entries (``seq < tree_size``), in log order, whatever their effective dates — the
    policy is about the log's checkpoints, not a contract year, so a checkpoint's policy
    is read from its own entries and never changes after it was signed. None: no policy.
    """
    policy = base.terms.witnesses
    for row in sorted(amendments, key=lambda r: r.seq):
        if row.seq >= tree_size:
            break
        terms = row.changes.get("terms")
        if isinstance(terms, Mapping) and "witnesses" in terms:
            value = terms["witnesses"]
            policy = None if value is None else WitnessPolicy.from_json(
                value, "changes.terms.witnesses")
    return policy
