"""The supervisor's typed state: incidents, the recovery in progress, pending moves.

An *incident* is one failure event waiting for its outcome (deaths within 1 s of an
unplanned failure are merged into it; later ones are incidents of their own in the same
recovery: a written record is never rewritten). A *recovery* is the membership
change under way for the pending incidents; a *move* is a pre-emptive or planned
migration waiting for a ready spare.
"""

from __future__ import annotations

import time
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
    # The coordinator stopped without ending the job (cut off from its hosts): nothing
    # recorded against anyone, ``yoco run --resume`` continues it.
    STOPPED = "stopped"


@dataclass(kw_only=True, slots=True)
class Incident:
    """One failure event waiting for its outcome."""

    event_id: str
    failure_class: FailureClass
    cause: str
    slots: list[str]
    # When it was detected (or began: a hang), on the supervisor's monotonic clock; the
    # record's occurred_at is the wall time of that instant (runtime.supervisor.wall_time).
    detected: float
    step: int
    # False: a death whose record is not written yet (its merge window is open or its
    # exit status unknown); its draft is durable (runtime.outbox.Outbox.write_drafts)
    # under ``event_id``.
    emitted: bool = True
    gen: int = -1  # the generation that failed
    note: str = ""  # appended to the failure's detail (e.g. the host borrowed for it)
    # A death during the recovery from an already recorded failure: its own failure
    # record (nothing written is ever rewritten), whose detail names that failure.
    joined: str = ""
    seen: float = field(default_factory=time.monotonic)  # when the supervisor saw it
    # The wall-clock date of ``detected``, fixed once: its draft and its record carry the
    # same date (two conversions of one monotonic instant can differ by a microsecond).
    occurred_at: str | None = None


@dataclass(kw_only=True, slots=True)
class Recovery:
    """The membership change under way for ``incidents`` (empty: none).

    ``outcome`` is what the incidents will get once generation ``gen`` completes a step:
    ``live_migrated`` unless some plan of this recovery rolled back (then every incident
    of it lost ``lost_steps`` = highest committed step - ``rollback_step`` + ``absorbed``:
    in transparent mode the survivors cannot rerun the step they were in, one more).
    """

    incidents: list[Incident] = field(default_factory=list)
    gen: int | None = None
    outcome: Outcome | None = None
    lost_steps: int = 0
    rollback_step: int | None = None  # checkpoint step of the rollback in progress
    absorbed: int = 0  # steps the rollback's survivors cannot rerun (transparent mode: 1)

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
    detected: float  # time.monotonic()


@dataclass(kw_only=True, slots=True, frozen=True)
class Fence:
    """Why the supervisor killed a live worker itself (recorded as the failure's cause)."""

    cause: str
    detail: str
    since: float | None = None  # when the failure began (a hang: progress stopped; monotonic)
