"""The supervisor: launches workers and hot spares, detects failures, plans every new
membership generation, and reports every event through the durable outbox.

One supervisor process per job (like ``torchrun``'s agent). It owns the ``TCPStore``
the workers rendezvous on, watches its children (a SIGKILL is seen within one poll,
~5 ms), reads fault reports, telemetry signals and drain requests, and writes records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime import records as R
from runtime.control import default_runs_root, take_requests, write_status
from runtime.errors import ConfigError
from runtime.faults import FaultSpec, encode_faults
from runtime.outbox import Deliverer, DeliveryConfig, Outbox
from runtime.processes import WorkerPool, process_exiting
from runtime.recovery import (
    FailureClass,
    Fence,
    Incident,
    JobState,
    Move,
    Outcome,
    Recovery,
    ReportedFault,
)
from runtime.sink import JsonlFileSink, RecordSink, SinkSpec
from runtime.state import latest_checkpoint
from runtime.telemetry import (
    CommandSignalSource,
    FileSignalSource,
    NvmlSource,
    Reading,
    Signal,
    TelemetrySource,
    WarningPolicy,
)

__all__ = ["Incident", "JobResult", "LaunchConfig", "Supervisor", "launch", "process_exiting"]

log = logging.getLogger("yoco.runtime.supervisor")


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """Everything ``yoco run`` decides about one job."""

    script: str
    args: list[str] = field(default_factory=list)
    workers: int = 2
    spares: int = 1
    contract_id: str = "default"
    job_id: str | None = None
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    runs_root: str | None = None
    sink: SinkSpec | None = None
    faults: list[FaultSpec] = field(default_factory=list)
    signal_file: str | None = None
    signal_command: str | None = None
    nvml: bool = True
    progress_interval_s: float = 10.0
    telemetry_interval_s: float = 0.1
    # Deaths are looked for every 5 ms (in /proc, no store traffic); what the workers
    # report through the store (progress, faults, readiness, the end) every this often:
    # each store request costs both ends CPU that a state transfer needs on a small box.
    store_poll_interval_s: float = 0.02
    fault_grace_s: float = 0.5
    max_recoveries: int = 64
    replenish_spares: bool = True
    # Replacement spares (and cold replacements in a rollback) are forked from a process
    # that has already imported torch (runtime.zygote): ready in ~0.5 s instead of 3-10 s.
    fork_spares: bool = True
    resume: bool = False
    host: str = "127.0.0.1"
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    finish_timeout_s: float = 120.0
    deliver_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("workers must be >= 1")
        if self.spares < 0:
            raise ConfigError("spares must be >= 0")
        if self.checkpoint_every < 0:
            raise ConfigError("checkpoint_every must be >= 0")
        if not self.contract_id:
            raise ConfigError("contract_id must not be empty")
        if self.job_id is not None and (not self.job_id or "/" in self.job_id):
            raise ConfigError("job_id must be a non-empty name without '/'")
        if not Path(self.script).is_file():
            raise ConfigError(f"script {self.script!r} does not exist")
        for name in ("progress_interval_s", "telemetry_interval_s", "fault_grace_s",
                     "finish_timeout_s", "deliver_timeout_s", "store_poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.max_recoveries < 1:
            raise ConfigError("max_recoveries must be >= 1")


@dataclass(kw_only=True, slots=True)
class JobResult:
    """What a finished :meth:`Supervisor.run` returns."""

    job_id: str
    run_dir: Path
    exit_code: int
    final_step: int
    recoveries: list[dict[str, Any]]
    delivered: bool


class Supervisor:
    """Runs one job to completion (see :meth:`run`)."""

    def __init__(self, config: LaunchConfig, sink: RecordSink | None = None) -> None:
        self.cfg = config
        self.job_id = config.job_id or f"job-{uuid.uuid4().hex[:12]}"
        self.run_dir = Path(config.runs_root or default_runs_root()) / self.job_id
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = Path(config.checkpoint_dir or self.run_dir / "checkpoints")
        self.signal_file = Path(config.signal_file or self.run_dir / "signals.jsonl")
        self.control_dir = self.run_dir / "control"
        self.outbox = Outbox(self.run_dir / "outbox")
        if sink is None:
            sink = (config.sink.build() if config.sink is not None
                    else JsonlFileSink(self.run_dir / "records.jsonl"))
        self.deliverer = Deliverer(self.outbox, sink, DeliveryConfig())
        self.node = socket.gethostname()
        self.ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.pool = WorkerPool(python=config.python, script=config.script, args=config.args,
                               log_dir=self.run_dir / "logs")
        self.gpu_of: dict[str, int] = {}
        # Membership: the current generation, its members and who holds their state.
        self.gen = -1
        self.members: list[str] = []
        self.holders: set[str] = set()
        self.spares: list[str] = []
        self.retired: set[str] = set()  # left on purpose, finished, or already handled
        self.moving: set[str] = set()  # drained/warned workers until they have left
        # Failures and their recovery.
        self.state = JobState.RUNNING
        self.recovery = Recovery()
        self.unemitted: list[Incident] = []  # deaths recovered from, record not yet written
        self.recoveries: list[dict[str, Any]] = []
        self.fenced: dict[str, Fence] = {}
        self.fault_seen = 0
        self.first_fault: ReportedFault | None = None
        self.killed_at: float | None = None  # when an injected kill fired (benchmarks)
        self.moves: list[Move] = []
        # Progress as rank 0 reports it.
        self.last_step = 0
        self.step_seconds = 0.0
        self._last_progress_emit = 0.0
        self._progress_step_emitted = -1
        self._last_status = 0.0
        self._last_telemetry = 0.0
        self._last_store_poll = 0.0
        self.sources: list[TelemetrySource] = [FileSignalSource(self.signal_file)]
        if config.signal_command:
            self.sources.append(CommandSignalSource(config.signal_command))
        if config.nvml:
            nv = NvmlSource()
            if nv.available:
                self.sources.append(nv)
            else:
                log.info("no NVML on this machine: pre-emptive signals come from %s%s",
                         self.signal_file,
                         f" and `{config.signal_command}`" if config.signal_command else "")
        self.policy = WarningPolicy()
        self.store = dist.TCPStore(config.host, 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60))

    # ----------------------------------------------------------------- records
    def _emit(self, rec: dict[str, Any]) -> None:
        self.outbox.append(rec)  # fsync'd before the supervisor moves on

    # ----------------------------------------------------------------- processes
    def _spawn(self) -> str:
        slot = self.pool.next_slot()
        env = {**os.environ, **self.cfg.env,
               P.ENV_STORE: f"{self.cfg.host}:{self.store.port}",
               P.ENV_SLOT: slot,
               P.ENV_RUN_DIR: str(self.run_dir),
               P.ENV_FAULTS: encode_faults(self.cfg.faults),
               P.ENV_CKPT_EVERY: str(self.cfg.checkpoint_every),
               P.ENV_CKPT_DIR: str(self.ckpt_dir),
               P.ENV_SIGNAL_FILE: str(self.signal_file),
               P.ENV_CONTROL_DIR: str(self.control_dir)}
        if self.ngpu:
            self.gpu_of[slot] = self.pool.started % self.ngpu
            env[P.ENV_DEVICE] = f"cuda:{self.gpu_of[slot]}"
        else:
            env[P.ENV_DEVICE] = "cpu"
        self.pool.spawn(slot, env)
        return slot

    def _alive(self, slot: str) -> bool:
        return self.pool.alive(slot)

    def _ready_spares(self) -> list[str]:
        return [s for s in self.spares
                if self._alive(s) and self.store.check([P.waiting_key(s)])]

    def _replenish(self) -> None:
        if not self.cfg.replenish_spares:
            return
        self.spares = [s for s in self.spares if self._alive(s)]
        while len(self.spares) < self.cfg.spares:
            self.spares.append(self._spawn())

    def _publish(self, plan: P.Plan) -> None:
        self.store.set(P.plan_key(plan.gen), plan.encode())
        self.store.set(P.KEY_GEN, str(plan.gen))
        self.gen = plan.gen
        self.members = list(plan.members)
        self._write_status(JobState.RUNNING)

    def _write_status(self, state: JobState) -> None:
        self._last_status = time.time()
        write_status(self.run_dir, {
            "job_id": self.job_id, "state": state.value, "pid": os.getpid(), "gen": self.gen,
            "members": self.members, "spares": self.spares, "step": self.last_step,
            "contract_id": self.cfg.contract_id})

    # ----------------------------------------------------------------- main loop
    def run(self) -> JobResult:
        """Run the job to completion, recovering from failures; never raises for a
        training failure (the outcome is in the records and the exit code).

        Exit code 0: the job finished; 1: it failed (outcome ``failed``).
        """
        self.deliverer.start()
        prior = [r for r in self._outbox_history() if r.get("job_id") == self.job_id]
        resume_ckpt = latest_checkpoint(self.ckpt_dir) if self.cfg.resume else None
        if not any(r["kind"] == "job_started" for r in prior):
            self._emit(R.job_started(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                     gpus=self.cfg.workers))
        members = [self._spawn() for _ in range(self.cfg.workers)]
        self.spares = [self._spawn() for _ in range(self.cfg.spares)]
        if self.cfg.fork_spares:
            self.pool.start_zygote({**os.environ, **self.cfg.env})
        self.holders = set(members)
        if resume_ckpt is not None:
            # The previous supervisor died: its workers died with it, so this is a rollback.
            ck_step, ck_path = resume_ckpt
            last = max([int(r.get("step", 0)) for r in prior] + [ck_step])
            inc = self._open_incident(FailureClass.UNPLANNED, "supervisor_lost", [], last,
                                      "supervisor restarted; job resumes from checkpoint")
            self.last_step = last
            self.recovery = Recovery(incidents=[inc], gen=0, outcome=Outcome.ROLLED_BACK,
                                     lost_steps=last - ck_step)
            self._publish(P.Plan(gen=0, mode=P.PlanMode.RESUME, members=members,
                                 ckpt=str(ck_path), ckpt_step=ck_step))
        else:
            self._publish(P.Plan(gen=0, mode=P.PlanMode.START, members=members))
        try:
            return self._loop()
        finally:
            self._shutdown()

    def _loop(self) -> JobResult:
        while True:
            self._handle_deaths()
            self._emit_deaths(block=False)
            if self.state == JobState.FAILED:
                return self._result(1)
            now = time.time()
            if now - self._last_store_poll < self.cfg.store_poll_interval_s:
                time.sleep(0.005)
                continue
            self._last_store_poll = now
            self._handle_faults()
            self._handle_ready()
            if now - self._last_telemetry >= self.cfg.telemetry_interval_s:
                self._last_telemetry = now
                self._handle_telemetry()
                self._handle_drains()
            self._handle_moves()
            self._handle_progress()
            if self.store.check([P.KEY_DONE]):
                return self._finish(int(self.store.get(P.KEY_DONE)))
            if now - self._last_status > 1.0:
                self._write_status(JobState.RUNNING)
            if not self.recovery.active:
                self._replenish()
            time.sleep(0.005)

    # ----------------------------------------------------------------- failures
    def _failure_record(self, failure_class: FailureClass, cause: str, slots: list[str],
                        step: int, detail: str, detected: float) -> dict[str, Any]:
        gpu = self.gpu_of.get(slots[0]) if slots else None
        rec = R.failure(contract_id=self.cfg.contract_id, job_id=self.job_id,
                        failure_class=failure_class.value, cause=cause, node=self.node,
                        gpu=gpu, step=step, detail=detail,
                        occurred_at=datetime.fromtimestamp(detected, UTC).isoformat())
        self._emit(rec)
        log.warning("failure %s/%s on %s at step %d: %s", failure_class, cause,
                    ",".join(slots) or "-", step, detail)
        return rec

    def _open_incident(self, failure_class: FailureClass, cause: str, slots: list[str],
                       step: int, detail: str, detected: float | None = None) -> Incident:
        detected = detected or time.time()
        rec = self._failure_record(failure_class, cause, slots, step, detail, detected)
        return Incident(event_id=rec["event_id"], failure_class=failure_class, cause=cause,
                        slots=slots, detected=detected, step=step)

    def _dead_members(self) -> list[tuple[str, int | None]]:
        """Members that died, with their exit status (None: still being torn down)."""
        out: list[tuple[str, int | None]] = []
        for slot in list(self.members) + list(self.moving):
            p = self.pool.procs.get(slot)
            if p is None or slot in self.retired:
                continue
            rc = p.poll()
            if rc is None:
                if not process_exiting(p.pid):
                    continue  # alive
                if not (self.store.check([P.left_key(slot)])
                        or self.store.check([P.finished_key(slot)])):
                    out.append((slot, None))  # killed or crashing: act now, classify later
                continue  # an orderly exit is judged by its exit status once reaped
            if self.store.check([P.left_key(slot)]) or (
                    rc == 0 and self.store.check([P.finished_key(slot)])):
                self.retired.add(slot)  # left on purpose after a move, or finished
                self.moving.discard(slot)
                continue
            out.append((slot, rc))
        return out

    def _handle_deaths(self) -> None:
        dead = self._dead_members()
        if not dead:
            return
        detected = time.time()
        self._handle_progress()  # the step reached, as of now
        # No settle window: deaths of the same incident seen later (a node or the whole job
        # going down, one process at a time) are merged into it and planned again.
        for slot, _ in dead:
            self.retired.add(slot)
            self.moving.discard(slot)
        slots = [s for s, _ in dead]
        self.first_fault = None
        pending = self.recovery.incidents
        last = pending[-1] if pending else None
        if last is not None and last.failure_class == FailureClass.UNPLANNED \
                and detected - last.detected < 1.0:
            pending.pop()
            last.slots += slots
            self._recover(last, [s for s in slots if s in self.members])
            return
        inc = Incident(event_id="", failure_class=FailureClass.UNPLANNED, cause="",
                       slots=slots, detected=detected, step=self.last_step, emitted=False,
                       gen=self.gen)
        self.unemitted.append(inc)
        self.killed_at = self._read_killed_at()
        self._recover(inc, [s for s in slots if s in self.members])

    def _emit_deaths(self, *, block: bool) -> None:
        """Write the failure records of deaths already acted on, once their exit status
        is known (``block``: wait for it, as an outcome must follow its failure)."""
        for inc in list(self.unemitted):
            rcs: list[tuple[str, int | None]] = []
            for slot in inc.slots:
                p = self.pool.procs[slot]
                rc = p.poll()
                if rc is None and (block or time.time() - inc.detected > 5.0):
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        rc = p.wait(timeout=max(5.0 - (time.time() - inc.detected), 0.01))
                rcs.append((slot, rc))
            if any(rc is None for _, rc in rcs) and not block \
                    and time.time() - inc.detected <= 5.0:
                continue
            if self.store.check([P.KEY_PROGRESS]):
                # Progress the failed generation reported just before the death (rank 0
                # commits, then a peer dies in the next step) was maybe not read yet.
                prog = json.loads(self.store.get(P.KEY_PROGRESS))
                if int(prog.get("gen", inc.gen)) <= inc.gen:
                    inc.step = max(inc.step, int(prog["step"]))
                    self.last_step = max(self.last_step, inc.step)
                    rec = self.recovery
                    if rec.outcome == Outcome.ROLLED_BACK and rec.rollback_step is not None:
                        rec.lost_steps = max(rec.lost_steps, inc.step - rec.rollback_step)
            fenced = [self.fenced[s] for s in inc.slots if s in self.fenced]
            if fenced:
                cause, detail = fenced[0].cause, fenced[0].detail
            else:
                rc = rcs[0][1]
                if rc is None or rc in (-signal.SIGKILL, -signal.SIGTERM):
                    cause = "process_killed"
                elif rc < 0:
                    cause = "process_crashed"
                else:
                    cause = "process_exit"
                detail = ", ".join(f"{s} exit {rc}" for s, rc in rcs)
            rec_ = self._failure_record(FailureClass.UNPLANNED, cause, inc.slots, inc.step,
                                        detail, inc.detected)
            inc.event_id, inc.cause, inc.emitted = rec_["event_id"], cause, True
            self.unemitted.remove(inc)

    def _read_killed_at(self) -> float | None:
        if self.store.check([P.KEY_KILLED_AT]):
            t = float(self.store.get(P.KEY_KILLED_AT))
            self.store.delete_key(P.KEY_KILLED_AT)
            return t
        return None

    def _recover(self, inc: Incident, dead: list[str]) -> None:
        rec = self.recovery
        rec.incidents.append(inc)
        if len(self.recoveries) + len(rec.incidents) > self.cfg.max_recoveries:
            self._fail("too many recoveries")
            return
        survivors = [m for m in self.members if m not in dead and self._alive(m)]
        holders = [m for m in survivors if m in self.holders]
        # A spare still importing torch is still better than a rollback: the new group
        # simply forms when it arrives, and no step is lost.
        ready = self._ready_spares()
        ready += [s for s in self.spares if self._alive(s) and s not in ready]
        if holders and len(ready) >= len(dead):
            replace = dict(zip(dead, ready, strict=False))
            members = [replace.get(m, m) for m in self.members]
            for s in replace.values():
                self.spares.remove(s)
            plan = P.Plan(gen=self.gen + 1, mode=P.PlanMode.LIVE, members=members)
            if rec.outcome != Outcome.ROLLED_BACK:
                rec.outcome = Outcome.LIVE_MIGRATED
        else:
            ck = self._latest_ckpt()
            if ck is None:
                self._fail("no live replica or spare, and no checkpoint to roll back to")
                return
            ck_step, ck_path = ck
            members = []
            pool = [s for s in self.spares if self._alive(s)]
            for m in self.members:
                if m in survivors:
                    members.append(m)
                elif pool:
                    s = pool.pop(0)
                    self.spares.remove(s)
                    members.append(s)
                else:
                    members.append(self._spawn())  # cold: imports torch from scratch
            plan = P.Plan(gen=self.gen + 1, mode=P.PlanMode.ROLLBACK, members=members,
                          ckpt=str(ck_path), ckpt_step=ck_step)
            rec.outcome = Outcome.ROLLED_BACK
            rec.rollback_step = ck_step
            rec.lost_steps = max(self.last_step - ck_step, rec.lost_steps)
        log.warning("generation %d: %s recovery, members %s", plan.gen, plan.mode, members)
        rec.gen = plan.gen
        self._publish(plan)

    def _latest_ckpt(self) -> tuple[int, Path] | None:
        if self.store.check([P.KEY_CKPT]):
            info = json.loads(self.store.get(P.KEY_CKPT))
            if Path(info["path"]).exists():
                return int(info["step"]), Path(info["path"])
        return latest_checkpoint(self.ckpt_dir) if self.cfg.checkpoint_every else None

    def _fail(self, why: str) -> None:
        log.error("job %s failed: %s", self.job_id, why)
        self._emit_deaths(block=True)
        now = time.time()
        for inc in self.recovery.incidents:
            self._emit(R.outcome(contract_id=self.cfg.contract_id, failure_event_id=inc.event_id,
                                 outcome=Outcome.FAILED.value, lost_steps=self.last_step,
                                 recovery_seconds=max(now - inc.detected, 0.0),
                                 step_seconds=max(self.step_seconds, 1e-6),
                                 gpus_affected=self.cfg.workers))
        self.recovery = Recovery()
        self._emit(R.job_finished(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                  step=self.last_step))
        self.state = JobState.FAILED

    def _handle_faults(self) -> None:
        count = int(self.store.add(P.KEY_FAULTS, 0))
        if count != self.fault_seen:
            self.fault_seen = count
            for slot in self.members:
                if not self.store.check([P.fault_key(slot)]):
                    continue
                report = P.FaultReport.decode(self.store.get(P.fault_key(slot)))
                self.store.delete_key(P.fault_key(slot))
                if report.gen < self.gen:
                    continue  # about a generation already replaced
                if report.phase == P.Phase.ROLLBACK:
                    if not self.recovery.active:
                        self.recovery.incidents.append(self._open_incident(
                            FailureClass.UNPLANNED, "checkpoint_unreadable", [slot],
                            self.last_step, report.error))
                    self._fail(f"rollback failed on {slot}: {report.error}")
                    return
                if self.first_fault is None:
                    self.first_fault = ReportedFault(at=time.time(), slot=slot,
                                                     error=report.error)
        if self.first_fault is not None:
            ff = self.first_fault
            if time.time() - ff.at >= self.cfg.fault_grace_s and self._alive(ff.slot):
                # No process died: the reporter's own collective failed. Fence it (kill)
                # and let the death path replace it.
                self.fenced[ff.slot] = Fence(cause="collective_error", detail=ff.error)
                self.pool.kill(ff.slot)
                self.first_fault = None

    def _handle_ready(self) -> None:
        rec = self.recovery
        if rec.gen is None or not self.store.check([P.ready_key(rec.gen)]):
            return
        timing = json.loads(self.store.get(P.ready_key(rec.gen)))
        self._emit_deaths(block=True)
        rec = self.recovery  # (unchanged: emitting deaths does not plan)
        outcome = rec.outcome or Outcome.LIVE_MIGRATED
        step_s = self.step_seconds or float(timing["step_seconds"])
        for inc in rec.incidents:
            lost = rec.lost_steps if outcome == Outcome.ROLLED_BACK else 0
            self._emit(R.outcome(contract_id=self.cfg.contract_id, failure_event_id=inc.event_id,
                                 outcome=outcome.value, lost_steps=lost,
                                 recovery_seconds=max(timing["first_step"] - inc.detected, 0.0),
                                 step_seconds=max(step_s, 1e-6),
                                 gpus_affected=len(self.members)))
            self.recoveries.append({
                "outcome": outcome.value, "class": inc.failure_class.value, "cause": inc.cause,
                "lost_steps": lost, "detected": inc.detected,
                "killed_at": self.killed_at, **timing})
        self.recovery = Recovery()
        self.holders = set(self.members)

    # ----------------------------------------------------------------- moves
    def _handle_telemetry(self) -> None:
        items: list[Reading | Signal] = []
        for src in self.sources:
            try:
                items.extend(src.poll())
            except Exception as exc:  # a broken source must not stop the job
                log.warning("telemetry source %s failed: %s", type(src).__name__, exc)
        readings = [i for i in items if isinstance(i, Reading)]
        signals = [i for i in items if isinstance(i, Signal)] + self.policy.evaluate(readings)
        for sig in signals:
            slot = sig.worker
            if slot is None and sig.gpu is not None:
                slot = next((m for m in self.members if self.gpu_of.get(m) == sig.gpu), None)
            if slot is None or slot not in self.members:
                continue
            if any(mv.slot == slot for mv in self.moves) or slot in self.moving:
                continue
            self.moves.append(Move(slot=slot, failure_class=FailureClass.PREEMPTIVE,
                                   cause=sig.cause, detail=sig.detail, detected=time.time()))

    def _handle_drains(self) -> None:
        for req in take_requests(self.control_dir):
            slot = str(req.get("worker"))
            if slot in self.spares:
                self.spares.remove(slot)  # draining an idle spare: just retire it
                self.retired.add(slot)
                self.pool.kill(slot)
                continue
            if slot not in self.members or slot in self.moving:
                log.warning("drain request for unknown or moving worker %s ignored", slot)
                continue
            self.moves.append(Move(slot=slot, failure_class=FailureClass.PLANNED,
                                   cause="maintenance", detail=str(req.get("reason", "drain")),
                                   detected=time.time()))

    def _handle_moves(self) -> None:
        if not self.moves or self.recovery.active:
            return  # one membership change at a time; a move waits for the recovery
        ready = self._ready_spares()
        if not ready:
            if not self.spares and not self.cfg.replenish_spares:
                log.warning("cannot move off %s: no spare", self.moves[0].slot)
            return
        mv = self.moves.pop(0)
        if mv.slot not in self.members:
            # It died (an unplanned failure, already recorded) or was replaced meanwhile.
            log.warning("%s move off %s dropped: no longer a member", mv.failure_class,
                        mv.slot)
            return
        spare = ready[0]
        self.spares.remove(spare)
        members = [spare if m == mv.slot else m for m in self.members]
        donors = [mv.slot] if len(self.members) == 1 else []
        inc = self._open_incident(mv.failure_class, mv.cause, [mv.slot], self.last_step,
                                  mv.detail, mv.detected)
        self.recovery = Recovery(incidents=[inc], gen=self.gen + 1,
                                 outcome=Outcome.LIVE_MIGRATED)
        self.moving.add(mv.slot)
        self.killed_at = None
        self._publish(P.Plan(gen=self.gen + 1, mode=P.PlanMode.MOVE, members=members,
                             donors=donors))

    # ----------------------------------------------------------------- progress & end
    def _handle_progress(self) -> None:
        if not self.store.check([P.KEY_PROGRESS]):
            return
        prog = json.loads(self.store.get(P.KEY_PROGRESS))
        self.last_step = max(self.last_step, int(prog["step"]))
        self.step_seconds = float(prog["step_seconds"])
        now = time.time()
        if now - self._last_progress_emit >= self.cfg.progress_interval_s \
                and self.last_step != self._progress_step_emitted:
            self._last_progress_emit = now
            self._progress_step_emitted = self.last_step
            self._emit(R.job_progress(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                      step=self.last_step,
                                      step_seconds=max(self.step_seconds, 1e-6)))

    def _finish(self, step: int) -> JobResult:
        self._handle_ready()
        self.last_step = step
        self._emit(R.job_finished(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                  step=step))
        deadline = time.time() + self.cfg.finish_timeout_s
        for slot in self.members:
            p = self.pool.procs[slot]
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.time(), 0.1))
        bad = [s for s in self.members if self.pool.procs[s].returncode not in (0, None)]
        return self._result(0 if not bad else 1)

    def _result(self, code: int) -> JobResult:
        self._write_status(JobState.FAILED if code else JobState.FINISHED)
        return JobResult(job_id=self.job_id, run_dir=self.run_dir, exit_code=code,
                         final_step=self.last_step, recoveries=self.recoveries,
                         delivered=False)

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.store.set(P.KEY_SHUTDOWN, "1")
        self.pool.shutdown()

    def deliver_and_stop(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout``) for the sink to acknowledge every record; True if so.

        What is not delivered stays in the outbox for the next run.
        """
        return self.deliverer.stop(self.cfg.deliver_timeout_s if timeout is None else timeout)

    def _outbox_history(self) -> list[dict[str, Any]]:
        path = self.outbox.dir / "records.jsonl"
        if not path.exists():
            return []
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def launch(config: LaunchConfig, sink: RecordSink | None = None) -> JobResult:
    """Run a job under the supervisor in this process and deliver its records.

    ``sink`` overrides ``config.sink``; with neither, records go to
    ``RUN_DIR/records.jsonl``. Returns when the job has finished or failed and the
    outbox is drained (or ``deliver_timeout_s`` passed: the rest stays in the outbox).
    """
    sup = Supervisor(config, sink)
    result = sup.run()
    result.delivered = sup.deliver_and_stop()
    return result
