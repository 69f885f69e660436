"""The supervisor's typed state: incidents, the recovery in progress, pending moves.

An *incident* is one failure event waiting for its outcome (deaths within 1 s of an
unplanned failure still recovering are merged into it). A *recovery* is the membership
change under way for the pending incidents; a *move* is a pre-emptive or planned
migration waiting for a ready spare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class FailureClass(StrEnum):
    """DESIGN section 2: the class of a failure event."""

    UNPLANNED = "unplanned"
    PREEMPTIVE = "preemptive"
    PLANNED = "planned"


class Outcome(StrEnum):
    """DESIGN section 2: the outcome of a failure event."""

    LIVE_MIGRATED = "live_migrated"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


class JobState(StrEnum):
    """What ``status.json`` says about the job."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(kw_only=True, slots=True)
class Incident:
    """One failure event waiting for its outcome."""

    event_id: str
    failure_class: FailureClass
    cause: str
    slots: list[str]
    detected: float
    step: int
    emitted: bool = True  # False: a death whose exit status is not known yet
    gen: int = -1  # the generation that failed
    note: str = ""  # appended to the failure's detail (e.g. the host borrowed for it)


@dataclass(kw_only=True, slots=True)
class Recovery:
    """The membership change under way for ``incidents`` (empty: none).

    ``outcome`` is what the incidents will get once generation ``gen`` completes a step:
    ``live_migrated`` unless some plan of this recovery rolled back (then every incident
    of it lost ``lost_steps`` = highest committed step - ``rollback_step``).
    """

    incidents: list[Incident] = field(default_factory=list)
    gen: int | None = None
    outcome: Outcome | None = None
    lost_steps: int = 0
    rollback_step: int | None = None  # checkpoint step of the rollback in progress

    @property
    def active(self) -> bool:
        """True while an incident waits for its outcome."""
        return bool(self.incidents)


@dataclass(kw_only=True, slots=True)
class Move:
    """A pre-emptive or planned migration off ``slot`` waiting for a ready spare."""

    slot: str
    failure_class: FailureClass
    cause: str
    detail: str
    since: float | None = None  # when the failure began (a hang: progress stopped)
    detected: float


@dataclass(kw_only=True, slots=True, frozen=True)
class Fence:
    """Why the supervisor killed a live worker itself (recorded as the failure's cause)."""

    cause: str
    detail: str
    since: float | None = None  # when the failure began (a hang: progress stopped)


@dataclass(kw_only=True, slots=True, frozen=True)
class ReportedFault:
    """The first collective failure a worker reported while nobody had died (yet)."""

    at: float
    slot: str
    error: str
