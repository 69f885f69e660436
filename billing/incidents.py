"""Failures that happened together: one outage seen as several failures.

A node losing power interrupts every job on it; a switch failing, every job behind it.
The ledger records one failure per interrupted job, and nothing in a record says which
outage it belongs to.  Pages group them so a customer sees one event, not ten unrelated
lines: failures of the same cause each starting within :data:`INCIDENT_GAP` of the one
before form an *incident*.  The grouping is a reading aid stated as such ("N failures
of the same cause within M minutes"); it changes no figure — every failure still counts
on its own.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Protocol

__all__ = ["INCIDENT_GAP", "Incident", "group_incidents"]

#: The longest pause between two failures of one incident.
INCIDENT_GAP: Final = timedelta(minutes=15)


class _FailureLike(Protocol):
    @property
    def event_id(self) -> str: ...

    @property
    def occurred_at(self) -> datetime: ...

    @property
    def cause(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Incident:
    """Failures of one cause close together in time: their ids (oldest first), the cause
    and the first and last failure's times.  ``number`` counts incidents from 1 in the
    order they began."""

    number: int
    cause: str
    event_ids: tuple[str, ...]
    first: datetime
    last: datetime

    @property
    def size(self) -> int:
        """How many failures the incident holds."""
        return len(self.event_ids)


def group_incidents(failures: Sequence[_FailureLike],
                    gap: timedelta = INCIDENT_GAP) -> dict[str, Incident]:
    """Each failure id of an incident of two or more failures, mapped to its incident;
    a failure alone is in no incident (absent).

    A failure joins the open incident of its cause when it starts at most ``gap`` after
    that incident's latest failure; otherwise it opens a new one.  Failures are taken
    oldest first (time, then id), whatever their order here.  Raises ValueError for a
    negative ``gap``.
    """
    if gap < timedelta(0):
        raise ValueError(f"gap: must not be negative, got {gap}")
    groups: list[list[_FailureLike]] = []
    open_by_cause: dict[str, list[_FailureLike]] = {}
    for f in sorted(failures, key=lambda f: (f.occurred_at, f.event_id)):
        group = open_by_cause.get(f.cause)
        if group is not None and f.occurred_at - group[-1].occurred_at <= gap:
            group.append(f)
            continue
        group = [f]
        groups.append(group)
        open_by_cause[f.cause] = group
    out: dict[str, Incident] = {}
    number = 0
    for group in groups:
        if len(group) < 2:
            continue
        number += 1
        incident = Incident(number=number, cause=group[0].cause,
                            event_ids=tuple(f.event_id for f in group),
                            first=group[0].occurred_at, last=group[-1].occurred_at)
        for f in group:
            out[f.event_id] = incident
    return out
