"""The TorchFT adapter: a lost replica group, in the ledger's words.

What TorchFT does: the job is several *replica groups* (each a full copy of the model,
data-parallel among themselves) coordinated by a lighthouse. Each step starts with a
quorum; when a group dies the others' step in flight is not committed
(``should_commit()`` is False), the next quorum leaves the dead group out and the
survivors go on at reduced width, from the state they hold. When the group is restarted
(by torchx, Slurm, Kubernetes...) it joins a later quorum and *heals*: it receives the
live state (weights, optimizer, step) from a peer over TorchFT's checkpoint transport,
and full width is back. No checkpoint is read and no committed step is redone.

In DESIGN's terms (section 2) that is a ``failure`` of class ``unplanned`` whose
``outcome`` is ``live_migrated`` with ``lost_steps`` 0: the job continued from the state it
had, and the replacement got that state by a live copy from a healthy replica -- the same
mechanism as yoco's own live migration, only later (the replacement is cold-started, not
a hot spare). Its cost is the lost group's idle devices until it is back:
``gpus_affected`` = the group's devices, ``recovery_seconds`` = failure → the rejoined
group's first committed step. If instead the group rejoins *behind* the steps it had done
(every group died and the job restarted from a checkpoint, or from scratch), it is
``rolled_back`` with ``lost_steps`` = steps it had done − steps it rejoined at.
docs/adapters.md says why, and what this leaves out.

Who reports: each replica group reports *its own* failures, from its rank 0, when it is
restarted (the group that failed is the one that knows it failed, and a group is
restarted after its old process is gone, so one process at a time holds its outbox).
Records are decided once in the shared state folder, so a reporter killed half-way never
writes a second record. The adapter does not import torchft: the script passes what its
``Manager`` says (``current_step()``, ``num_participants()``).

Use::

    rep = TorchFTReporter.from_env(replica_group="1", replica_groups=2)
    with rep:
        while manager.current_step() < total:
            manager.start_quorum()
            ...forward, backward, manager.allreduce(grads)...
            if manager.should_commit():
                optimizer.step()
                rep.committed(manager.current_step(), manager.num_participants())
        rep.finished(manager.current_step())
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from adapters.common import (
    AdapterConfig,
    Mark,
    Progress,
    Reporter,
    StateDir,
    clip,
    close_main,
    exception_note,
    failure_cause,
    iso,
    parse_iso,
    write_new,
)
from runtime import records as R
from runtime.errors import ConfigError

log = logging.getLogger("yoco.adapters.torchft")


@dataclass(kw_only=True, slots=True, frozen=True)
class GroupAttempt:
    """One start of a replica group's rank 0, and what it did."""

    number: int
    started_at: float
    group_world_size: int
    #: Steps committed and when (None: no step committed).
    progress: Mark | None
    #: The first step this start committed and when (None: none).
    first: tuple[int, float] | None
    #: Replica groups in the quorum at its last committed step (None: unknown).
    participants: int | None


class ReplicaGroupState:
    """The part of a TorchFT job's state folder that belongs to one replica group."""

    def __init__(self, state: StateDir, group: str) -> None:
        self.state = state
        self.group = group
        self.folder = f"groups/{group}/attempts"

    def side(self, n: int, suffix: str) -> Path:
        """A file of attempt ``n`` (``progress``, ``first``, ``participants``)."""
        return self.state.root / self.folder / f"{n:06d}.{suffix}"

    def attempts(self) -> list[GroupAttempt]:
        """Every start of this group, oldest first."""
        out = []
        for info in self.state.attempts(self.folder):
            n = int(info["attempt"])
            first = _read(self.side(n, "first"))
            parts = _read(self.side(n, "participants"))
            out.append(GroupAttempt(
                number=n, started_at=float(info["started_at"]),
                group_world_size=int(info["group_world_size"]),
                progress=Progress.read(self.side(n, "progress")),
                first=None if first is None else (int(first[0]), float(first[1])),
                participants=None if parts is None else int(parts[0])))
        return out


class TorchFTJob:
    """Decides a TorchFT job's records from its state folder."""

    def __init__(self, config: AdapterConfig) -> None:
        self.config = config
        self.state = StateDir(config.state_dir)

    def group(self, group: str) -> ReplicaGroupState:
        """The state of replica group ``group``."""
        return ReplicaGroupState(self.state, group)

    def groups(self) -> list[str]:
        """Every replica group that registered a start."""
        base = self.state.root / "groups"
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []

    def job_started(self, gpus: int) -> dict[str, Any]:
        """The job's ``job_started`` record (decided by the first group to start)."""
        return self.state.claim("job_started", lambda: R.job_started(
            contract_id=self.config.contract_id, job_id=self.config.job_id, gpus=gpus))

    def failure_record(self, grp: ReplicaGroupState, attempts: list[GroupAttempt], k: int
                       ) -> dict[str, Any]:
        """The ``failure`` of replica group ``grp``'s start ``k`` (it ended unfinished)."""
        att = attempts[k]
        until = attempts[k + 1].started_at if k + 1 < len(attempts) else time.time()
        notes = [n for n in self.state.notes(f"g{grp.group}")
                 if att.started_at - 5.0 <= float(n["at"]) <= until]
        noted = {int(n["rank"]) for n in notes}
        silent = [r for r in range(att.group_world_size) if r not in noted]
        cause = failure_cause(silent, notes)
        held = att.progress.steps if att.progress is not None else None
        at = (float(notes[0]["at"]) if notes else
              att.progress.at if att.progress is not None else att.started_at)
        parts = [f"TorchFT replica group {grp.group} ({att.group_world_size} process"
                 f"{'es' if att.group_world_size > 1 else ''}) lost"
                 + (f" after {held} committed steps" if held is not None else
                    " before committing a step")
                 + (f", in a quorum of {att.participants} replica groups; the others "
                    "continued without it" if att.participants else "")]
        if silent:
            parts.append(f"group rank{'s' if len(silent) > 1 else ''} "
                         f"{', '.join(map(str, silent))}: no exit note (killed by a signal, "
                         "or its node was lost)")
        parts += [f"group rank {n['rank']}: {n['exception']}: {n['message']}" for n in notes]
        return R.failure(contract_id=self.config.contract_id, job_id=self.config.job_id,
                         failure_class="unplanned", cause=cause, step=held,
                         detail=clip("; ".join(parts)), occurred_at=iso(at))

    def outcome_record(self, attempts: list[GroupAttempt], k: int, failure: Mapping[str, Any],
                       *, finished: Mapping[str, Any] | None = None,
                       closing_at: float | None = None) -> dict[str, Any] | None:
        """The ``outcome`` of start ``k``'s failure, or None while the group is not back.

        Back (a later start committed a step): ``live_migrated`` when it rejoined at or
        beyond the steps it had done (healed from a live peer), else ``rolled_back`` with
        the difference lost. Never back, when closing (``closing_at``): ``live_migrated``
        if another group finished the job (``finished``) at or beyond those steps (the
        others carried on; the group's devices idled until the end), else ``failed`` with
        every step it had done lost, as yoco's runtime records a job that did not recover.
        """
        att = attempts[k]
        held = att.progress.steps if att.progress is not None else 0
        failed_at = parse_iso(str(failure["occurred_at"]))
        back = next((a for a in attempts[k + 1:] if a.first is not None), None)
        if back is not None and back.first is not None:
            first_step, done_at = back.first
            rejoined = first_step - 1  # the state it started its first committed step from
            lost = max(held - rejoined, 0)
            kind = "live_migrated" if lost == 0 else "rolled_back"
        elif closing_at is not None:
            if finished is not None and held <= int(finished["step"]):
                kind, lost = "live_migrated", 0
                done_at = parse_iso(str(finished["occurred_at"]))
            else:  # the job did not get past the steps this group had done
                kind, lost, done_at = "failed", held, closing_at
        else:
            return None
        step_seconds = self.step_seconds(attempts, k)
        return R.outcome(contract_id=self.config.contract_id,
                         failure_event_id=str(failure["event_id"]), outcome=kind,
                         lost_steps=lost, recovery_seconds=round(max(done_at - failed_at, 0.0), 6),
                         step_seconds=round(step_seconds, 6),
                         gpus_affected=att.group_world_size * self.config.gpus_per_process,
                         occurred_at=iso(max(done_at, failed_at)))

    def step_seconds(self, attempts: list[GroupAttempt], k: int) -> float:
        """The steady step time before start ``k``'s failure: that start's, else an
        earlier one's, else another replica group's (they step together), else a later
        start's; a record needs a value > 0."""
        own = [*reversed(attempts[: k + 1])]
        others = [a for g in self.groups() for a in reversed(self.group(g).attempts())]
        for a in [*own, *others, *attempts[k + 1:]]:
            if a.progress is not None and a.progress.step_seconds > 0:
                return a.progress.step_seconds
        return 1e-6

    def settle(self, reporter: Reporter, grp: ReplicaGroupState, *, upto: int,
               finished: Mapping[str, Any] | None = None, closing_at: float | None = None
               ) -> int:
        """Decide (or re-emit) the failures of ``grp``'s starts before ``upto`` and the
        outcomes that can be decided; append them to ``reporter``. Returns how many
        failures there are."""
        attempts = grp.attempts()
        count = min(upto, len(attempts))
        for k in range(count):
            name = f"groups/{grp.group}/failure-{k:06d}"
            failure = self.state.claim(name, functools.partial(
                self.failure_record, grp, attempts, k))
            reporter.emit(failure)
            outcome = self.state.decided(f"groups/{grp.group}/outcome-{k:06d}")
            if outcome is None:
                built = self.outcome_record(attempts, k, failure, finished=finished,
                                            closing_at=closing_at)
                if built is not None:
                    outcome = self.state.claim(f"groups/{grp.group}/outcome-{k:06d}",
                                               functools.partial(dict, built))
            if outcome is not None:
                reporter.emit(outcome)
        return count


class TorchFTReporter:
    """Reports one TorchFT replica group's failures (see the module doc).

    Every process of the group creates one; only ``group_rank`` 0 writes records.
    ``replica_group`` names the group stably across its restarts (not TorchFT's replica
    id, which gets a fresh uuid per start); ``replica_groups`` is how many the job runs
    (for ``job_started.gpus``).
    """

    def __init__(self, config: AdapterConfig, *, replica_group: str, replica_groups: int,
                 group_rank: int = 0, group_world_size: int = 1) -> None:
        if not replica_group or "/" in replica_group or replica_group.startswith("."):
            raise ConfigError(f"replica_group must be a plain name, got {replica_group!r}")
        if replica_groups < 1 or group_world_size < 1 or not 0 <= group_rank < group_world_size:
            raise ConfigError("need replica_groups >= 1, group_world_size >= 1 and "
                              "0 <= group_rank < group_world_size")
        self.config = config
        self.replica_group = replica_group
        self.group_rank = group_rank
        self.job = TorchFTJob(config)
        self.grp = self.job.group(replica_group)
        self.reporting = group_rank == 0
        self.attempt = -1
        self._reporter: Reporter | None = None
        self._progress: Progress | None = None
        self._first = False
        self._participants: int | None = None
        if not self.reporting:
            return
        if self.job.state.decided("job_finished") is not None:
            raise ConfigError(f"job {config.job_id} in {config.state_dir} has finished; a "
                              "new run needs a new job id and state folder")
        self.attempt = self.job.state.new_attempt(
            {"started_at": time.time(), "group_world_size": group_world_size,
             "node": config.node, "pid": os.getpid()}, folder=self.grp.folder)
        self._progress = Progress(self.grp.side(self.attempt, "progress"))
        self._reporter = Reporter(config.state_dir / "groups" / replica_group / "outbox",
                                  config.sink)
        # Every group's outbox carries the job's start before anything of its own, so
        # whichever outbox the ledger hears from first, the job exists there.
        self._reporter.emit(self.job.job_started(
            replica_groups * group_world_size * config.gpus_per_process))
        self.job.settle(self._reporter, self.grp, upto=self.attempt)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, replica_group: str,
                 replica_groups: int, group_rank: int = 0, group_world_size: int = 1,
                 **overrides: Any) -> TorchFTReporter:
        """A reporter configured from ``YOCO_*`` variables (see docs/adapters.md)."""
        config = AdapterConfig.from_env(env, **overrides)
        return cls(config, replica_group=replica_group, replica_groups=replica_groups,
                   group_rank=group_rank, group_world_size=group_world_size)

    @property
    def outbox(self) -> Reporter | None:
        """The group's outbox and delivery (None on group ranks other than 0)."""
        return self._reporter

    def committed(self, steps: int, participants: int | None = None) -> None:
        """Say the quorum committed: ``steps`` is ``manager.current_step()`` after
        ``should_commit()`` returned True, ``participants`` its ``num_participants()``.
        The first call after a restart decides the outcome of the group's failure."""
        if self._reporter is None or self._progress is None:
            return
        mark = self._progress.note(steps)
        if participants is not None and participants != self._participants:
            self._participants = participants
            self.grp.side(self.attempt, "participants").write_text(f"{participants}\n")
        if not self._first:
            self._first = True
            write_new(self.grp.side(self.attempt, "first"), f"{steps} {mark.at!r}\n".encode())
            self.job.settle(self._reporter, self.grp, upto=self.attempt)

    def finished(self, steps: int) -> bool:
        """Record ``job_finished`` (the first group to finish decides it) and wait for the
        sink; True when every record of this group is delivered."""
        if self._reporter is None:
            return True
        self.job.settle(self._reporter, self.grp, upto=self.attempt)
        done = self.job.state.claim("job_finished", lambda: R.job_finished(
            contract_id=self.config.contract_id, job_id=self.config.job_id, step=steps))
        self._reporter.emit(done)
        write_new(self.grp.side(self.attempt, "finished"), b"")
        return self.close(self.config.deliver_timeout_s)

    def close(self, timeout: float = 5.0) -> bool:
        """Stop delivering (waiting up to ``timeout`` s); the rest waits in the outbox."""
        if self._progress is not None:
            self._progress.close()
        if self._reporter is None:
            return True
        reporter, self._reporter = self._reporter, None
        return reporter.close(timeout)

    def __enter__(self) -> TorchFTReporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.job.state.write_note(f"g{self.replica_group}", f"rank{self.group_rank}",
                                      exception_note(exc, rank=self.group_rank,
                                                     node=self.config.node))
        self.close(min(self.config.deliver_timeout_s, 5.0))


def close_job(config: AdapterConfig, *, now: float | None = None) -> tuple[int, bool]:
    """After every replica group has exited: a group whose last start did not finish
    gets its failure and outcome (see :meth:`TorchFTJob.outcome_record`), then delivery.
    Returns (failures recorded, delivered everything)."""
    job = TorchFTJob(config)
    groups = job.groups()
    if not groups:
        raise ConfigError(f"no TorchFT replica group recorded in {config.state_dir}")
    closing = time.time() if now is None else now
    # Only a group that finished makes the job's end a recovery for the others.
    real_finish = job.state.decided("job_finished")
    finished = real_finish
    if finished is None:
        held = [a.progress.steps for g in groups for a in job.group(g).attempts()
                if a.progress is not None]
        finished = job.state.claim("job_finished", functools.partial(
            R.job_finished, contract_id=config.contract_id, job_id=config.job_id,
            step=max(held, default=0), occurred_at=iso(closing)))
    total, delivered = 0, True
    for name in groups:
        grp = job.group(name)
        attempts = grp.attempts()
        last_done = grp.side(len(attempts) - 1, "finished").exists()
        reporter = Reporter(config.state_dir / "groups" / name / "outbox", config.sink)
        started = job.state.decided("job_started")
        if started is not None:
            reporter.emit(started)
        total += job.settle(reporter, grp, upto=len(attempts) - (1 if last_done else 0),
                            finished=real_finish, closing_at=closing)
        reporter.emit(finished)
        delivered = reporter.close(config.deliver_timeout_s) and delivered
    return total, delivered


def _read(path: Path) -> list[str] | None:
    try:
        return path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return None



def main(argv: list[str] | None = None) -> int:
    """``python -m adapters.torchft close``: close a TorchFT job after its groups exit."""
    return close_main(argv, prog="python -m adapters.torchft", close_job=close_job, description=(
        "Close a TorchFT job's records after every replica group has exited: a group "
        "that did not finish gets its failure and outcome, and every group's outbox is "
        "delivered. Reads YOCO_CONTRACT_ID, YOCO_JOB_ID, YOCO_ADAPTER_DIR, YOCO_SINK "
        "and YOCO_SINK_ARGS."))


if __name__ == "__main__":
    raise SystemExit(main())
