"""The ``torchrun`` (torch.distributed.elastic) adapter.

What torchrun does: its agent starts the worker group, watches it, and when a worker fails
it stops every worker and starts the whole group again (``TORCHELASTIC_RESTART_COUNT``
goes up), at most ``--max-restarts`` times; the new group resumes from the script's
newest checkpoint. In the ledger's words (DESIGN section 2) each such restart is one
``failure`` whose ``outcome`` is ``rolled_back`` with ``lost_steps`` = the steps the group
had done when it failed minus the steps in the checkpoint the next group loaded (the steps
that must be redone). When the agent gives up, the open failures get ``failed``
(``python -m adapters.torchrun close``, run after torchrun exits).

Who reports: only global rank 0 of each worker group (one process at a time: torchrun has
stopped the old group before it starts the new one). Every rank leaves an *exit note* when
it ends by an exception (``with reporter:``). A rank that raised something other than a
communication error started the failure: ``process_crashed``; else a rank that left no
note ended without a word -- a signal (SIGKILL, the OOM killer) or a lost node --
``process_killed``; else ``collective_error`` (:func:`adapters.common.failure_cause`).

Use::

    rep = TorchrunReporter.from_env()          # YOCO_CONTRACT_ID, YOCO_ADAPTER_DIR, ...
    with rep:
        start = load_newest_checkpoint()        # steps done in it (0 for a fresh start)
        rep.resumed(start)
        for step in range(start, total):
            train_one_step()
            rep.step_done(step + 1)             # steps done so far
            if (step + 1) % every == 0:
                save_checkpoint(step + 1)
        rep.finished(total)

Records are decided once in the state folder (:meth:`adapters.common.StateDir.claim`), so a
reporter killed half-way, or a rank that sees the same restart, never writes a second
failure or outcome. Details and the choices made: docs/adapters.md.
"""

from __future__ import annotations

import functools
import json
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

log = logging.getLogger("yoco.adapters.torchrun")

#: Variables torchrun's agent sets in every worker.
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
ENV_RUN_ID = "TORCHELASTIC_RUN_ID"


@dataclass(kw_only=True, slots=True, frozen=True)
class Attempt:
    """One start of the worker group, as its rank 0 registered it, and what it did."""

    number: int
    restart_count: int
    max_restarts: int
    world_size: int
    started_at: float
    run_id: str
    #: Steps in the checkpoint this attempt loaded (None: it never got that far).
    resumed_steps: int | None
    #: The last steps done (None: it completed no step).
    progress: Mark | None
    #: When it completed its first step (None: it never did).
    first_step_at: float | None

    @property
    def held(self) -> int | None:
        """Steps the job had done when this attempt ended: the last step done, else the
        checkpoint it loaded, else None (it held nothing)."""
        if self.progress is not None:
            return self.progress.steps
        return self.resumed_steps


class TorchJob:
    """Reads a torchrun job's state folder: its attempts and the records decided."""

    def __init__(self, config: AdapterConfig) -> None:
        self.config = config
        self.state = StateDir(config.state_dir)

    def _side(self, n: int, suffix: str) -> Path:
        return self.state.root / "attempts" / f"{n:06d}.{suffix}"

    def attempts(self) -> list[Attempt]:
        """Every attempt so far, oldest first."""
        out = []
        for info in self.state.attempts():
            n = int(info["attempt"])
            resume = _read_json(self._side(n, "resume"))
            first = _read_json(self._side(n, "first"))
            out.append(Attempt(
                number=n, restart_count=int(info["restart_count"]),
                max_restarts=int(info["max_restarts"]), world_size=int(info["world_size"]),
                started_at=float(info["started_at"]), run_id=str(info["run_id"]),
                resumed_steps=None if resume is None else int(resume["steps"]),
                progress=Progress.read(self._side(n, "progress")),
                first_step_at=None if first is None else float(first["at"])))
        return out

    # ------------------------------------------------------------ what a record says
    def failure_record(self, attempts: list[Attempt], k: int) -> dict[str, Any]:
        """The ``failure`` record of attempt ``k``'s end (k is not the last attempt
        unless the job is being closed)."""
        att = attempts[k]
        nxt = attempts[k + 1] if k + 1 < len(attempts) else None
        until = nxt.started_at if nxt is not None else time.time()
        notes = [n for n in self.state.notes(f"r{att.restart_count}")
                 if att.started_at - 5.0 <= float(n["at"]) <= until]
        noted = {int(n["rank"]) for n in notes}
        silent = [r for r in range(att.world_size) if r not in noted]
        if nxt is not None and nxt.restart_count == att.restart_count:
            # The agent restarted the group without counting a failure: a membership
            # change (a node joined or left the rendezvous), by design of elastic training.
            failure_class, cause = "planned", "membership_change"
        else:
            failure_class, cause = "unplanned", failure_cause(silent, notes)
        if notes:
            at = float(notes[0]["at"])  # the first rank that saw it going down
        elif att.progress is not None:
            at = att.progress.at  # progress stopped after the last step done
        else:
            at = att.started_at
        parts = [f"torchrun worker group of {att.world_size} (run {att.run_id}, restart "
                 f"count {att.restart_count} of at most {att.max_restarts}) ended"
                 + (f" after {att.held} steps" if att.held is not None else "")]
        if silent:
            parts.append(f"rank{'s' if len(silent) > 1 else ''} "
                         f"{', '.join(map(str, silent))}: no exit note (killed by a signal -- "
                         "the agent stops the survivors with SIGTERM -- or its node was "
                         "lost)")
        parts += [f"rank {n['rank']}: {n['exception']}: {n['message']}" for n in notes]
        return R.failure(contract_id=self.config.contract_id, job_id=self.config.job_id,
                         failure_class=failure_class, cause=cause, step=att.held,
                         detail=clip("; ".join(parts)), occurred_at=iso(at))

    def outcome_record(self, attempts: list[Attempt], k: int, failure: Mapping[str, Any],
                       *, closing_at: float | None = None) -> dict[str, Any] | None:
        """The ``outcome`` of attempt ``k``'s failure, or None while it is pending.

        ``rolled_back`` once a later attempt completed a step: ``lost_steps`` = steps
        held at the failure − steps in the checkpoint the next attempt loaded;
        ``recovery_seconds`` = failure → that later attempt's first completed step.
        With ``closing_at`` (the job is over) an open failure gets ``failed``: lost = the
        steps held minus what a later attempt resumed from (already counted as lost
        there), or every step held.
        """
        att = attempts[k]
        later = attempts[k + 1:]
        resumed = next((a for a in later if a.resumed_steps is not None), None)
        recovered = next((a for a in later if a.first_step_at is not None), None)
        base = resumed.resumed_steps if resumed is not None else None
        # An attempt that held nothing lost nothing beyond what the next one loaded.
        held: int = att.held if att.held is not None else (base or 0)
        failed_at = parse_iso(str(failure["occurred_at"]))
        if recovered is not None and recovered.first_step_at is not None:
            assert base is not None  # a step done implies a resume (step_done ensures it)
            kind, lost = "rolled_back", max(held - base, 0)
            done_at = recovered.first_step_at
        elif closing_at is not None:
            kind, lost = "failed", max(held - base, 0) if base is not None else held
            done_at = closing_at
        else:
            return None
        return R.outcome(contract_id=self.config.contract_id,
                         failure_event_id=str(failure["event_id"]), outcome=kind,
                         lost_steps=lost, recovery_seconds=round(max(done_at - failed_at, 0.0), 6),
                         step_seconds=_step_seconds(attempts, k),
                         gpus_affected=att.world_size * self.config.gpus_per_process,
                         occurred_at=iso(max(done_at, failed_at)))

    def settle(self, reporter: Reporter, *, upto: int, closing_at: float | None = None
               ) -> None:
        """Decide (or re-emit) the failure of every attempt before ``upto`` and every
        outcome that can be decided, and append them to ``reporter``'s outbox."""
        attempts = self.attempts()
        for k in range(min(upto, len(attempts))):
            failure = self.state.claim(f"failure-{k:06d}",
                                       functools.partial(self.failure_record, attempts, k))
            reporter.emit(failure)
            outcome = self.state.decided(f"outcome-{k:06d}")
            if outcome is None:
                built = self.outcome_record(attempts, k, failure, closing_at=closing_at)
                if built is not None:
                    outcome = self.state.claim(f"outcome-{k:06d}", functools.partial(dict, built))
            if outcome is not None:
                reporter.emit(outcome)


class TorchrunReporter:
    """Reports a torchrun job's restarts from inside its training script (see module doc).

    Every rank creates one; only global rank 0 writes records. Raises
    :class:`~runtime.errors.ConfigError` when the process was not started by torchrun
    (no ``RANK``/``WORLD_SIZE``) or the job's state folder says it already finished.
    """

    def __init__(self, config: AdapterConfig, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        try:
            self.rank = int(env["RANK"])
            self.world_size = int(env["WORLD_SIZE"])
        except (KeyError, ValueError):
            raise ConfigError("RANK and WORLD_SIZE are not set: start the script with "
                              "torchrun") from None
        self.restart_count = int(env.get(ENV_RESTART_COUNT, "0"))
        self.max_restarts = int(env.get(ENV_MAX_RESTARTS, "0"))
        self.run_id = env.get(ENV_RUN_ID, "none")
        self.config = config
        self.job = TorchJob(config)
        self.reporting = self.rank == 0
        self.attempt = -1
        self._reporter: Reporter | None = None
        self._progress: Progress | None = None
        self._resumed: int | None = None
        self._stepped = False
        if not self.reporting:
            return
        if self.job.state.decided("job_finished") is not None:
            raise ConfigError(f"job {config.job_id} in {config.state_dir} has finished; "
                              "a new run needs a new job id and state folder")
        _write_status(config, "torchrun")
        self.attempt = self.job.state.new_attempt({
            "restart_count": self.restart_count, "max_restarts": self.max_restarts,
            "world_size": self.world_size, "started_at": time.time(), "run_id": self.run_id,
            "node": config.node, "pid": os.getpid()})
        self._progress = Progress(self.job._side(self.attempt, "progress"))
        self._reporter = Reporter(config.state_dir / "outbox", config.sink)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any
                 ) -> TorchrunReporter:
        """A reporter configured from ``YOCO_*`` variables (``YOCO_JOB_ID`` defaults to
        torchrun's run id)."""
        env = os.environ if env is None else env
        run_id = env.get(ENV_RUN_ID, "")
        config = AdapterConfig.from_env(
            env, default_job_id=run_id if run_id not in ("", "none") else None, **overrides)
        return cls(config, env)

    @property
    def outbox(self) -> Reporter | None:
        """The reporting process's outbox and delivery (None on other ranks)."""
        return self._reporter

    def resumed(self, steps: int) -> None:
        """Say the group starts from a checkpoint holding ``steps`` steps (0: from scratch).

        On rank 0 this records ``job_started`` on the first attempt and, on a restart, the
        ``failure`` of every earlier attempt (each decided once).
        """
        if not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        if self._reporter is None:
            return
        if self._resumed is not None:
            raise RuntimeError("resumed() was already called in this attempt")
        self._resumed = steps
        write_new(self.job._side(self.attempt, "resume"),
                  json.dumps({"steps": steps, "at": time.time()}).encode())
        first = self.job.attempts()[0]
        started = self.job.state.claim("job_started", lambda: R.job_started(
            contract_id=self.config.contract_id, job_id=self.config.job_id,
            gpus=self.world_size * self.config.gpus_per_process,
            occurred_at=iso(first.started_at)))
        self._reporter.emit(started)
        self.job.settle(self._reporter, upto=self.attempt)

    def step_done(self, steps: int) -> None:
        """Say ``steps`` steps are done (one ``pwrite``); the first call of an attempt
        decides the outcomes of the failures before it."""
        if self._reporter is None or self._progress is None:
            return
        if self._resumed is None:
            log.warning("step_done() before resumed(): taking the checkpoint as %d steps",
                        steps - 1)
            self.resumed(max(steps - 1, 0))
        mark = self._progress.note(steps)
        if not self._stepped:
            self._stepped = True
            write_new(self.job._side(self.attempt, "first"),
                      json.dumps({"steps": steps, "at": mark.at}).encode())
            self.job.settle(self._reporter, upto=self.attempt)

    def finished(self, steps: int) -> bool:
        """Record ``job_finished`` and wait for the sink (``deliver_timeout_s``); True
        when every record is delivered. Call on every rank (only rank 0 writes)."""
        if self._reporter is None:
            return True
        if self._resumed is None:
            self.resumed(steps)
        self.job.settle(self._reporter, upto=self.attempt)
        done = self.job.state.claim("job_finished", lambda: R.job_finished(
            contract_id=self.config.contract_id, job_id=self.config.job_id, step=steps))
        self._reporter.emit(done)
        return self.close(self.config.deliver_timeout_s)

    def close(self, timeout: float = 5.0) -> bool:
        """Stop delivering (waiting up to ``timeout`` s); what is left stays in the
        outbox for the next attempt or ``yoco outbox deliver``."""
        if self._progress is not None:
            self._progress.close()
        if self._reporter is None:
            return True
        reporter, self._reporter = self._reporter, None
        return reporter.close(timeout)

    def __enter__(self) -> TorchrunReporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.job.state.write_note(f"r{self.restart_count}", f"rank{self.rank}", exception_note(
                exc, rank=self.rank, node=self.config.node))
        self.close(min(self.config.deliver_timeout_s, 5.0))


def close_job(config: AdapterConfig, *, now: float | None = None) -> tuple[int, bool]:
    """After torchrun has exited: give every open failure its outcome (``failed`` when
    no later group completed a step), write ``job_finished`` if the job did not, and
    deliver. Returns (failures recorded, delivered everything)."""
    job = TorchJob(config)
    attempts = job.attempts()
    if not attempts:
        raise ConfigError(f"no torchrun attempt recorded in {config.state_dir}")
    reporter = Reporter(config.state_dir / "outbox", config.sink)
    finished = job.state.decided("job_finished")
    started = job.state.decided("job_started")
    if started is not None:
        reporter.emit(started)
    closing = time.time() if now is None else now
    upto = len(attempts) - 1 if finished is not None else len(attempts)
    job.settle(reporter, upto=upto, closing_at=None if finished is not None else closing)
    if finished is None:
        # The state the job ended with: the last attempt that held any.
        held = [a.held for a in attempts if a.held is not None]
        if started is None:  # not even the first group got to resumed()
            reporter.emit(job.state.claim("job_started", lambda: R.job_started(
                contract_id=config.contract_id, job_id=config.job_id,
                gpus=attempts[0].world_size * config.gpus_per_process,
                occurred_at=iso(attempts[0].started_at))))
        finished = job.state.claim("job_finished", lambda: R.job_finished(
            contract_id=config.contract_id, job_id=config.job_id, step=held[-1] if held else 0,
            occurred_at=iso(closing)))
        reporter.emit(finished)
    return upto, reporter.close(config.deliver_timeout_s)


def _write_status(config: AdapterConfig, runtime: str) -> None:
    # `yoco outbox list/deliver/resend JOB --runs-root PARENT` read the contract here.
    write_new(config.state_dir / "status.json", json.dumps({
        "job_id": config.job_id, "contract_id": config.contract_id, "runtime": runtime}
    ).encode())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None



def _step_seconds(attempts: list[Attempt], k: int) -> float:
    """The steady step time before failure ``k``: its attempt's, else an earlier one's,
    else a later one's (a record needs a value > 0)."""
    order = [*reversed(attempts[: k + 1]), *attempts[k + 1:]]
    for a in order:
        if a.progress is not None and a.progress.step_seconds > 0:
            return round(a.progress.step_seconds, 6)
    return 1e-6


def main(argv: list[str] | None = None) -> int:
    """``python -m adapters.torchrun close``: close a torchrun job after torchrun exits."""
    return close_main(argv, prog="python -m adapters.torchrun", close_job=close_job, description=(
        "Close a torchrun job's records after torchrun has exited: every failure gets "
        "its outcome (failed when no later worker group completed a step), job_finished "
        "is written, and the outbox is delivered. Reads YOCO_CONTRACT_ID, YOCO_JOB_ID, "
        "YOCO_ADAPTER_DIR, YOCO_SINK and YOCO_SINK_ARGS like the training script."))


if __name__ == "__main__":
    raise SystemExit(main())
