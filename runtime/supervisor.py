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
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime import records as R
from runtime.borrowing import CAUSE_LENT, LoanAction, Loans, loan_outcome
from runtime.checkpointing import read_committed
from runtime.control import (
    default_runs_root,
    take_requests,
    write_json_atomically,
    write_status,
)
from runtime.coordinator import (
    EXIT_STATUS_WAIT_S,
    MERGE_WINDOW_S,
    Borrow,
    FailJob,
    FenceNote,
    NeedCheckpoint,
    NewProcess,
    RecoveryView,
    SpareView,
    StartSpares,
    death_detected_at,
    plan_recovery,
    too_many_recoveries,
)
from runtime.deaths import Action as DeathAction
from runtime.deaths import (
    Deaths,
    DeathsConfig,
    Died,
    Journal,
    Poll,
    Recover,
    Resolve,
    WriteFailure,
    WriteOutcomes,
)
from runtime.detection import NODE_FLOOR_S
from runtime.errors import ConfigError, RecordError
from runtime.faults import FaultSpec, encode_faults
from runtime.loans import (
    CloseLoan,
    Grow,
    JobView,
    Lend,
    RestartDead,
    StartReplacements,
    borrowed_note,
)
from runtime.moves import Asked, Dropped, MoveQueue, NoSpare, StartMove
from runtime.moves import Poll as MovePoll
from runtime.nodepool import NodePool
from runtime.outbox import Deliverer, DeliveryConfig, Outbox, rescue_held_records
from runtime.processes import WorkerPool, process_exiting
from runtime.recovery import (
    FailureClass,
    Fence,
    Incident,
    JobState,
    Move,
    Outcome,
    Recovery,
)
from runtime.sharded_checkpoint import discard_partial_checkpoints, latest_sharded_checkpoint
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
    normalise_cause,
)
from runtime.watchdog import (
    Committed,
    Disarm,
    FaultReported,
    FenceHung,
    FenceReporter,
    GenerationReady,
    StallWatch,
    Tick,
    WatchConfig,
)

__all__ = ["EXIT_STATUS_WAIT_S", "MERGE_WINDOW_S", "Incident", "JobResult", "LaunchConfig",
           "Supervisor", "launch", "process_exiting"]

log = logging.getLogger("yoco.runtime.supervisor")


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """Everything ``yoco run`` decides about one job."""

    script: str
    args: list[str] = field(default_factory=list)
    workers: int = 2
    spares: int = 1
    # HSDP: ranks per replica group (FSDP2 shards inside it; runtime.hsdp). 1: plain DDP.
    shards: int = 1
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
    # Step watchdog: a job whose committed step has not advanced for
    # max(hang_floor_s, hang_factor x the longest of the recent step times) is hung
    # (until MIN_STEP_SAMPLES steps were seen after the warm-up: max(hang_floor_s,
    # hang_startup_s)); the ranks that stopped beating while their peers wait for them
    # are fenced (cause ``hang``). The deadline follows what this job's steps have
    # shown (a loaded machine's hiccups, a checkpoint step in the window make it longer);
    # the floor is the least a step may stall for scheduler noise alone. See
    # runtime.detection and docs/runtime.md ("Hung worker").
    hang_floor_s: float = 0.4
    hang_factor: float = 2.0
    hang_startup_s: float = 3.0
    # Stopped ranks (and frozen hosts on this machine): a member that /proc shows
    # stopped (state T/t) on every look for half of max(0.25 s, this x steady step),
    # with no committed step for all of it, is fenced at once (cause ``hang``): a stopped
    # process cannot be merely slow, however loaded the machine. 0: off (only the
    # deadline above). See runtime.processes.stopped_deadline and docs/runtime.md.
    hang_stopped_factor: float = 3.0
    # The workers' collective timeout (JobConfig.collective_timeout_s when None).
    collective_timeout_s: float | None = None
    max_recoveries: int = 64
    replenish_spares: bool = True
    # The workers and spares -- the first ones, replacement spares and cold replacements
    # in a rollback -- are forked from a process that has already imported torch
    # (runtime.zygote): a replacement is ready in ~0.5 s instead of 3-10 s, and N
    # processes cost one import of torch instead of N.
    fork_spares: bool = True
    resume: bool = False
    host: str = "127.0.0.1"
    # The store's port (0: any free one). Multi-node: the rendezvous port the agents use.
    port: int = 0
    # Multi-node (0: one host, processes started here). N: the job's processes are
    # started by N node agents (runtime.agent), which must register within
    # node_register_timeout_s; a node whose agent is silent for node_timeout_s is lost.
    nodes: int = 0
    # Multi-node: this (the coordinator's) host's node name, used in every record that
    # names no process's host (None: the machine's hostname), so that one host has one
    # name in all records.
    node_name: str | None = None
    node_timeout_s: float = 2.0
    # ...or sooner while the job is stalled: after runtime.detection.node_deadline
    # (max(node_floor_s, 3 x the longest recent heartbeat gap, the hang deadline of
    # ordinary steps), at most node_timeout_s); a coordinator cut off from most hosts
    # waits for node_timeout_s.
    node_floor_s: float = NODE_FLOOR_S
    node_register_timeout_s: float = 300.0
    # Spare borrowing (runtime.borrowing; multi-node only): HOST:PORT of the pool store
    # shared with other jobs, and this job's priority there (higher may borrow from lower).
    pool: str | None = None
    priority: int = 0
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    finish_timeout_s: float = 120.0
    deliver_timeout_s: float = 30.0
    # Disk held for the outbox from the start (released when the disk fills up, so that
    # records keep being written); a job whose outbox cannot get it does not start.
    outbox_reserve_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("workers must be >= 1")
        if self.spares < 0:
            raise ConfigError("spares must be >= 0")
        if self.shards < 1 or self.workers % self.shards:
            raise ConfigError(f"shards must be >= 1 and divide workers ({self.workers})")
        if self.checkpoint_every < 0:
            raise ConfigError("checkpoint_every must be >= 0")
        if not self.contract_id:
            raise ConfigError("contract_id must not be empty")
        if self.job_id is not None and (not self.job_id or "/" in self.job_id):
            raise ConfigError("job_id must be a non-empty name without '/'")
        if not Path(self.script).is_file():
            raise ConfigError(f"script {self.script!r} does not exist")
        for name in ("progress_interval_s", "telemetry_interval_s", "fault_grace_s",
                     "hang_floor_s", "hang_factor", "hang_startup_s",
                     "finish_timeout_s", "deliver_timeout_s", "store_poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.hang_stopped_factor < 0:
            raise ConfigError("hang_stopped_factor must be >= 0 (0: off)")
        if self.collective_timeout_s is not None and self.collective_timeout_s <= 0:
            raise ConfigError("collective_timeout_s must be > 0")
        if self.outbox_reserve_bytes < 0:
            raise ConfigError("outbox_reserve_bytes must be >= 0")
        if self.max_recoveries < 1:
            raise ConfigError("max_recoveries must be >= 1")
        if self.nodes < 0 or not 0 <= self.port < 65536:
            raise ConfigError("nodes must be >= 0 and port in 0..65535")
        if self.node_timeout_s <= 0 or self.node_register_timeout_s <= 0 \
                or self.node_floor_s <= 0:
            raise ConfigError("node timeouts and node_floor_s must be > 0")
        if self.pool is not None and not self.nodes:
            raise ConfigError("--pool (spare borrowing) needs a multi-node job (--nnodes)")


#: How long spare replenishment waits for a recovery in progress (see _replenish).
REPLENISH_DEFER_S = 2.0

#: ``yoco run``'s exit status when the job finished but records are not all delivered.
EXIT_UNDELIVERED = 3

#: ``yoco run``'s exit status when the coordinator stopped without ending the job: it
#: found itself cut off from a majority of its hosts (the agents' exit status for a lost
#: coordinator, runtime.agent.EXIT_COORDINATOR_LOST, is the same number). Nothing was
#: recorded against anyone; ``yoco run --resume`` on every host continues the job.
EXIT_CUT_OFF = 4

#: File in RUN_DIR a coordinator that stopped cut off writes (why, when, the step); the
#: next ``--resume`` says why in its ``supervisor_lost`` failure and removes it.
STOPPED_FILE = "stopped.json"

#: Every duration and deadline of the supervisor is on ``time.monotonic()`` (a step of
#: the wall clock must not fence a healthy rank or change a recorded duration); records
#: carry the wall-clock date of the monotonic instant.


def wall_time(mono: float) -> float:
    """The wall-clock time (epoch seconds) of the monotonic instant ``mono``."""
    return time.time() - (time.monotonic() - mono)


def wall_date(mono: float) -> str:
    """The wall-clock date (ISO 8601, UTC) of the monotonic instant ``mono``."""
    return datetime.fromtimestamp(wall_time(mono), UTC).isoformat()


def mono_time(wall: float) -> float:
    """The monotonic instant of the wall-clock time ``wall`` (epoch seconds): for dates
    that come from outside this process (a drain request's, a resumed job's last commit)."""
    return time.monotonic() - (time.time() - wall)


@dataclass(kw_only=True, slots=True)
class JobResult:
    """What a finished :meth:`Supervisor.run` returns (delivery fields: after
    :func:`launch` has tried to deliver the outbox)."""

    job_id: str
    run_dir: Path
    exit_code: int
    final_step: int
    recoveries: list[dict[str, Any]]
    delivered: bool
    #: Records still waiting for the sink (an outage): ``{"event_id", "kind"}``.
    pending: list[dict[str, str]] = field(default_factory=list)
    #: Records the sink refused for good: ``{"event_id", "kind", "reason"}``.
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    #: The latest outage the outbox saw (why ``pending`` is not empty).
    sink_error: str | None = None
    #: Why the outbox's disk could not take every record (full, read-only), if so.
    outbox_error: str | None = None
    #: Where records that neither the disk nor the sink took were saved instead.
    rescued: Path | None = None
    #: The latest failed checkpoint write not followed by a good one (status.json's).
    checkpoint_error: dict[str, Any] | None = None

    def delivery_report(self) -> list[str]:
        """One line per undelivered record, saying which and why (empty: all delivered)."""
        lines = [f"refused by the sink (dead letter): {d['kind']} {d['event_id']}: "
                 f"{d['reason']}" for d in self.dead_letters]
        why = self.sink_error or "the sink did not acknowledge it in time"
        lines += [f"pending (sink unreachable: {why}): {p['kind']} {p['event_id']}"
                  for p in self.pending]
        if self.outbox_error:
            lines.append(f"the outbox could not be written ({self.outbox_error})"
                         + (f": records not yet delivered saved in {self.rescued}"
                            if self.rescued else ": every record was delivered"))
        return lines


class _SupervisorView:
    """What the stall watch (runtime.watchdog) looks at, read from this supervisor's
    store and process pool when the watch asks."""

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup

    def quiet_nodes(self) -> bool:
        return bool(self._sup.pool.quiet_nodes())

    def node_silences(self) -> dict[str, float]:
        return self._sup.pool.node_silences()

    def host_of(self, slot: str) -> str | None:
        return self._sup.pool.node_of(slot)

    def stopped(self, slot: str) -> bool:
        return self._sup.pool.stopped(slot)

    def beat(self, slot: str) -> bytes | None:
        store = self._sup.store
        return store.get(P.beat_key(slot)) if store.check([P.beat_key(slot)]) else None

    def alive(self, slot: str) -> bool:
        return self._sup._alive(slot)

    def eligible(self, slot: str) -> bool:
        # Dead (the death path acts), or still starting: not stuck.
        return self._sup._alive(slot) and self._sup.store.check([P.waiting_key(slot)])

    def finished(self, slot: str) -> bool:
        return self._sup.store.check([P.finished_key(slot)])


class _DeathView:
    """What the deaths' machine (runtime.deaths) looks at, read from this supervisor's
    processes and store when it asks."""

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup

    def exit_statuses(self, slots: Sequence[str], wait_until: float | None
                      ) -> list[tuple[str, int | None]]:
        rcs: list[tuple[str, int | None]] = []
        for slot in slots:
            p = self._sup.pool.procs[slot]
            rc = p.poll()
            if rc is None and wait_until is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rc = p.wait(timeout=max(wait_until - time.monotonic(), 0.01))
            rcs.append((slot, rc))
        return rcs

    def steps_committed_in(self, gen: int) -> int:
        return self._sup._steps_committed_in(gen)

    def fences(self, slots: Sequence[str]) -> list[FenceNote]:
        # Several fenced groups merged into one incident (two hosts lost within the
        # merge window): the detail names each.
        fenced = self._sup.fenced
        return [FenceNote(cause=f.cause, detail=f.detail)
                for s in slots if (f := fenced.get(s)) is not None]


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
        self.outbox = Outbox(self.run_dir / "outbox", reserve_bytes=config.outbox_reserve_bytes)
        if sink is None:
            sink = (config.sink.build() if config.sink is not None
                    else JsonlFileSink(self.run_dir / "records.jsonl"))
        self.deliverer = Deliverer(self.outbox, sink, DeliveryConfig())
        self.node = config.node_name or socket.gethostname()
        self.ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.pool: WorkerPool | NodePool = WorkerPool(
            python=config.python, script=config.script, args=config.args,
            log_dir=self.run_dir / "logs")
        self.gpu_of: dict[str, int] = {}
        self.shard_of: dict[str, int] = {}  # HSDP: the shard each process is built for
        # Membership: the current generation, its members and who holds their state.
        self.gen = -1
        self.members: list[str] = []
        self.holders: set[str] = set()
        self.spares: list[str] = []
        self.retired: set[str] = set()  # left on purpose, finished, or already handled
        self.moving: set[str] = set()  # drained/warned workers until they have left
        self.gone: set[str] = set()  # died after the job's last step was committed
        # Failures and their recovery.
        self.state = JobState.RUNNING
        # The open incidents, the recovery under way and the deaths whose records are
        # not written yet: a state machine (runtime.deaths), its looks served by
        # self.death_view, its actions carried out by _carry_out_deaths.
        self.deaths = Deaths(DeathsConfig(window_s=MERGE_WINDOW_S,
                                          status_wait_s=EXIT_STATUS_WAIT_S))
        self.death_view = _DeathView(self)
        self.recoveries: list[dict[str, Any]] = []
        self.fenced: dict[str, Fence] = {}
        self.fault_seen = 0
        self.killed_at: float | None = None  # when an injected kill fired (benchmarks)
        # Moves waiting for a spare: a state machine (runtime.moves) fed the telemetry's
        # and the operator's requests, its actions carried out by _handle_moves.
        self.move_queue = MoveQueue()
        # Progress as rank 0 reports it.
        self.last_step = 0
        self.step_seconds = 0.0
        self._last_progress_emit = 0.0
        self._progress_step_emitted = -1
        self._last_status = 0.0
        self._last_telemetry = 0.0
        self._last_store_poll = 0.0
        self._published_at = 0.0  # when the latest plan was published
        # The step watchdog and the blame for a reported collective fault: a state
        # machine fed this loop's observations (runtime.watchdog), its looks served by
        # self.watch_view, its actions carried out by _handle_watch.
        self.watch = StallWatch(WatchConfig(
            hang_floor_s=config.hang_floor_s, hang_factor=config.hang_factor,
            hang_startup_s=config.hang_startup_s,
            hang_stopped_factor=config.hang_stopped_factor,
            fault_grace_s=config.fault_grace_s, checkpoint_every=config.checkpoint_every))
        self.watch_view = _SupervisorView(self)
        # The disk refusing status.json, and the latest failed checkpoint write.
        self.status_error: str | None = None
        self.checkpoint_error: dict[str, Any] | None = None
        self._ckpt_errors_seen = 0
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
        self.store = dist.TCPStore(config.host, config.port, is_master=True,
                                   wait_for_workers=False, timeout=timedelta(seconds=60))
        self.store.set(P.KEY_JOB, self.job_id)  # agents check whose store they reached
        # The coordinator's liveness for the agents' watchdogs (runtime.agent), from a
        # thread on a connection of its own: the loop's own waits (a finishing member,
        # an exit status) must not look like a lost coordinator.
        self._beating = threading.Event()
        if config.nodes:
            self._beating.set()
            threading.Thread(target=self._coordinator_beat, name="yoco-coordinator-beat",
                             daemon=True).start()
        if config.nodes:
            # The agents start the processes (each on its host); this waits for them.
            self.pool = NodePool(self.store, nodes=config.nodes,
                                 node_timeout_s=config.node_timeout_s,
                                 register_timeout_s=config.node_register_timeout_s,
                                 stopped_factor=config.hang_stopped_factor,
                                 step_seconds=lambda: self.step_seconds,
                                 node_floor_s=config.node_floor_s,
                                 step_deadline=self.step_deadline,
                                 stalled=self.stalled_s)
        # Hosts shared with other jobs (lent and borrowed): runtime.borrowing.
        self.loans = Loans(
            store=self.store, nodes=self.pool, job_id=self.job_id,  # type: ignore[arg-type]
            endpoint=f"{config.host}:{self.store.port}", workers=config.workers,
            spec={"script": config.script, "args": config.args, "python": config.python,
                  "job": self.job_id},
            pool=config.pool, priority=config.priority) if config.pool else None

    @property
    def recovery(self) -> Recovery:
        """The membership change under way and its open incidents (the deaths' machine
        keeps it; a move, a loan and a resume start theirs by setting it)."""
        return self.deaths.recovery

    @recovery.setter
    def recovery(self, rec: Recovery) -> None:
        self.deaths.recovery = rec

    def _coordinator_beat(self) -> None:
        """Advance :data:`runtime.protocol.KEY_COORD_BEAT` every COORD_BEAT_INTERVAL_S
        until :attr:`_beating` is cleared (the job's end, or this coordinator cut off)."""
        store = dist.TCPStore(self.cfg.host, self.store.port, is_master=False,
                              timeout=timedelta(seconds=5))
        while self._beating.is_set():
            with contextlib.suppress(RuntimeError, dist.DistStoreError):
                store.add(P.KEY_COORD_BEAT, 1)
            time.sleep(P.COORD_BEAT_INTERVAL_S)

    # ----------------------------------------------------------------- records
    def _emit(self, rec: dict[str, Any]) -> None:
        self.outbox.append(rec)  # fsync'd before the supervisor moves on

    # ----------------------------------------------------------------- processes
    def _spawn(self, shard: int | None = None) -> str:
        """Start a worker (or spare) process; with HSDP it is built for ``shard`` (default:
        the shard index fewest live spares hold)."""
        slot = self.pool.next_slot()
        if shard is None:
            have = [self.shard_of.get(sp) for sp in self.spares if self._alive(sp)]
            shard = min(range(self.cfg.shards), key=lambda i: (have.count(i), i))
        self.shard_of[slot] = shard
        env = {**os.environ, **self.cfg.env,
               P.ENV_SHARDS: str(self.cfg.shards), P.ENV_SHARD_INDEX: str(shard),
               P.ENV_STORE: f"{self.cfg.host}:{self.store.port}",
               P.ENV_SLOT: slot,
               P.ENV_RUN_DIR: str(self.run_dir),
               P.ENV_FAULTS: encode_faults(self.cfg.faults),
               P.ENV_CKPT_EVERY: str(self.cfg.checkpoint_every),
               P.ENV_CKPT_DIR: str(self.ckpt_dir),
               P.ENV_SIGNAL_FILE: str(self.signal_file),
               P.ENV_CONTROL_DIR: str(self.control_dir)}
        if self.cfg.collective_timeout_s is not None:
            env[P.ENV_COLLECTIVE_TIMEOUT] = str(self.cfg.collective_timeout_s)
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
        if self.recovery.active and time.monotonic() - self._published_at < REPLENISH_DEFER_S:
            # A replacement spare builds its model and pre-faults its receive buffers:
            # hundreds of ms of CPU and memory bandwidth that, started during the
            # recovery, slowed the state transfer it competes with (two cores). Started
            # once the new generation has stepped (or after REPLENISH_DEFER_S); a second
            # death meanwhile still gets a spare at once (_recover forks one).
            return
        self.spares = [s for s in self.spares if self._alive(s)]
        while len(self.spares) < self.cfg.spares and self.pool.has_room():
            self.spares.append(self._spawn())

    def _publish(self, plan: P.Plan) -> None:
        plan.shards = self.cfg.shards
        self.store.set(P.plan_key(plan.gen), plan.encode())
        self.store.set(P.KEY_GEN, str(plan.gen))
        self._published_at = time.monotonic()
        self.gen = plan.gen
        self.members = list(plan.members)
        self._write_status(JobState.RUNNING)

    def _write_status(self, state: JobState) -> None:
        """Replace status.json; a disk that refuses it (full, read-only) is logged and
        retried at the next status write -- it never stops the job (the records have
        their own reserved disk, runtime.outbox)."""
        self._last_status = time.monotonic()
        try:
            write_status(self.run_dir, self._status(state))
        except OSError as exc:
            why = exc.strerror or str(exc)
            if why != self.status_error:
                log.error("cannot write %s (%s): the job goes on; status.json is stale "
                          "until the disk takes it again", self.run_dir / "status.json", why)
            self.status_error = why
            return
        if self.status_error is not None:
            log.warning("status.json written again (after: %s)", self.status_error)
            self.status_error = None

    def _status(self, state: JobState) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "state": state.value, "pid": os.getpid(), "gen": self.gen,
            "members": self.members, "spares": self.spares, "step": self.last_step,
            "contract_id": self.cfg.contract_id, "spares_configured": self.cfg.spares,
            "store_port": self.store.port,
            # The data-parallel width over time (it changes only while a host is lent).
            "widths": self.loans.widths if self.loans is not None else
            [{"gen": 0, "width": self.cfg.workers, "from_step": 0}],
            "moves_pending": [{"worker": mv.slot, "class": mv.failure_class.value,
                               "cause": mv.cause, "since": wall_time(mv.detected)}
                              for mv in self.move_queue.pending],
            # The latest checkpoint write that failed (None: the last one succeeded).
            "checkpoint_error": self.checkpoint_error,
            "pids": {s: self.pool.procs[s].pid for s in [*self.members, *self.spares]
                     if s in self.pool.procs}}

    # ----------------------------------------------------------------- main loop
    def run(self) -> JobResult:
        """Run the job to completion, recovering from failures; never raises for a
        training failure (the outcome is in the records and the exit code).

        Exit code 0: the job finished; 1: it failed (outcome ``failed``).
        """
        self.deliverer.start()
        prior = [r for r in self._outbox_history() if r.get("job_id") == self.job_id
                 or r["kind"] == "outcome"]
        started = any(r["kind"] == "job_started" for r in prior)
        if self.cfg.resume and any(r["kind"] == "job_finished" for r in prior):
            return self._finished_already(prior)
        # Read before any worker starts: the new rank 0 overwrites it.
        committed = read_committed(self.run_dir / P.COMMITTED_FILE) if self.cfg.resume \
            else None
        if not started:
            self._emit(R.job_started(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                     gpus=self.cfg.workers))
        if self.cfg.fork_spares:  # first: the workers and spares are forked from it
            self.pool.start_zygote({**os.environ, **self.cfg.env})
        members = [self._spawn(i % self.cfg.shards) for i in range(self.cfg.workers)]
        self.spares = [self._spawn(i % self.cfg.shards) for i in range(self.cfg.spares)]
        self.holders = set(members)
        if self.cfg.resume and started:
            self._resume(prior, committed, members)
        else:
            self._publish(P.Plan(gen=0, mode=P.PlanMode.START, members=members))
        try:
            return self._loop()
        except Exception as exc:
            return self._crashed(exc)
        finally:
            self._shutdown()

    def _crashed(self, exc: Exception) -> JobResult:
        """The supervisor cannot go on (a bug, or something it cannot handle): stop the
        workers at once -- unsupervised training would be unrecorded -- and record the
        end truthfully: the open failures (or this one) failed, the job finished."""
        log.exception("supervisor stopped by an error: %s; stopping the workers now", exc)
        for p in self.pool.procs.values():
            with contextlib.suppress(OSError):
                p.kill()
        with contextlib.suppress(Exception):
            self.store.set(P.KEY_SHUTDOWN, "1")
        if self.state != JobState.FAILED:
            if not self.recovery.active:
                self.recovery.incidents.append(self._open_incident(
                    FailureClass.UNPLANNED, "supervisor_error", [], self.last_step,
                    f"supervisor error: {type(exc).__name__}: {exc}"[:500]))
            self._fail(f"supervisor error: {exc}")
        return self._result(1)

    def _resume(self, prior: list[dict[str, Any]], committed: tuple[int, float] | None,
                members: list[str]) -> None:
        """Plan generation 0 after the previous supervisor died (its workers died with
        it): record the loss with the true lost steps (the last committed step, from
        RUN_DIR/committed, minus the checkpoint's step; all of them without a checkpoint)
        and the time since progress stopped, and close every failure it left open."""
        if self.cfg.shards > 1:
            # The dead supervisor's writers are gone: their unfinished sharded
            # checkpoints can only be in the way (a rewrite of the same step and
            # generation would reuse the temporary folder).
            for tmp in discard_partial_checkpoints(self.ckpt_dir):
                log.warning("removed the unfinished checkpoint %s", tmp)
        ck = latest_checkpoint(self.ckpt_dir) if self.cfg.shards == 1 else \
            latest_sharded_checkpoint(self.ckpt_dir)
        ck_step = ck[0] if ck is not None else 0
        # The last committed step: rank 0's note (after a rollback it is below steps that
        # older records carry); without it, the highest step a record or checkpoint shows.
        steps = [int(r["step"]) for r in prior if isinstance(r.get("step"), int)]
        last = max(committed[0], ck_step) if committed else max([*steps, ck_step])
        # Progress stopped at the last commit (else at the last record it wrote).
        times = [datetime.fromisoformat(r["occurred_at"]).timestamp() for r in prior]
        # Across a lost supervisor its monotonic clock is gone with it: the dead time is
        # measured on the wall clock (the last commit's date, rank 0's note), the one
        # duration that is (docs/runtime.md, "Clocks").
        stopped = committed[1] if committed else max(times, default=time.time())
        outcomes = {r["failure_event_id"] for r in prior if r["kind"] == "outcome"}
        open_failures = [
            Incident(event_id=r["event_id"], failure_class=FailureClass(r["failure_class"]),
                     cause=r["cause"], slots=[],
                     detected=mono_time(datetime.fromisoformat(r["occurred_at"]).timestamp()),
                     step=int(r.get("step", last)))
            for r in prior if r["kind"] == "failure" and r["event_id"] not in outcomes]
        how = (f"resumes from the checkpoint of step {ck_step}" if ck is not None
               else "retrains from step 0: no checkpoint")
        stopped_note = self.run_dir / STOPPED_FILE
        what = f"supervisor lost at step {last}"
        with contextlib.suppress(OSError, ValueError, KeyError):
            what = (f"coordinator stopped at step {last}, cut off from its hosts "
                    f"({json.loads(stopped_note.read_text())['why']})")[:300]
        # Failures the lost supervisor had acted on but not recorded yet (it died inside
        # their merge window): its loss is part of that incident -- one failure, the
        # draft's (its id, date, cause, node), saying so, and no supervisor_lost failure.
        known = {r["event_id"] for r in self._outbox_history()}
        drafts = [d for d in self.outbox.read_drafts()
                  if d["event_id"] not in known and d.get("job_id") == self.job_id]
        incidents = self._record_drafts(drafts, last, f"{what} before recording it; "
                                                    f"restarted, the job {how}")
        if not incidents:
            incidents = [self._open_incident(
                FailureClass.UNPLANNED, "supervisor_lost", [], last,
                f"{what}; restarted, the job {how}"
                + (f"; {len(open_failures)} open failure(s) closed by this rollback"
                   if open_failures else ""), detected=mono_time(stopped))]
        for f in open_failures:
            log.warning("failure %s (%s) was left without an outcome by the lost "
                        "supervisor: it gets this rollback's outcome", f.event_id, f.cause)
        with contextlib.suppress(FileNotFoundError):
            stopped_note.unlink()  # its failure is recorded (just above)
        self.last_step = last
        self.recovery = Recovery(incidents=[*open_failures, *incidents], gen=0,
                                 outcome=Outcome.ROLLED_BACK, lost_steps=last - ck_step)
        if ck is not None:
            self._publish(P.Plan(gen=0, mode=P.PlanMode.RESUME, members=members,
                                 ckpt=str(ck[1]), ckpt_step=ck_step))
        else:
            self._publish(P.Plan(gen=0, mode=P.PlanMode.START, members=members))

    def _record_drafts(self, drafts: list[dict[str, Any]], last: int, note: str
                       ) -> list[Incident]:
        """Write the failure record of each draft a lost supervisor left (see
        MERGE_WINDOW_S) with its own id, date, cause and node, ``note`` appended to its
        detail and its step the last committed one ``last`` when later (the rollback's
        lost steps are counted from there); then remove the drafts. Returns their
        incidents, open until this resume's rollback gives them their outcome."""
        incidents = []
        for d in drafts:
            tail = f"; {note}"
            detail = (str(d.get("detail") or "")[:max(500 - len(tail), 0)] + tail)[:500]
            step = max(int(d.get("step") or 0), last)
            try:
                rec = R.validate_record({**d, "detail": detail, "step": step})
                occurred = datetime.fromisoformat(rec["occurred_at"]).timestamp()
                failure_class = FailureClass(rec["failure_class"])
            except (RecordError, ValueError, KeyError, TypeError) as exc:
                log.error("a lost supervisor's failure draft %s is not a valid failure "
                          "(%s): recorded as the supervisor's loss instead", d["event_id"], exc)
                continue
            self._emit(rec)
            log.warning("failure %s/%s on %s at step %d, acted on by the lost supervisor "
                        "but not recorded by it: recorded now (%s)", rec["failure_class"],
                        rec["cause"], rec.get("node", "-"), step, detail)
            incidents.append(Incident(event_id=rec["event_id"], failure_class=failure_class,
                                      cause=rec["cause"], slots=[],
                                      detected=mono_time(occurred), step=step))
        self.outbox.write_drafts([])
        return incidents

    def _finished_already(self, prior: list[dict[str, Any]]) -> JobResult:
        """``--resume`` of a job whose end is recorded: start nothing, only deliver."""
        end = [r for r in prior if r["kind"] == "job_finished"][-1]
        failed = any(r["kind"] == "outcome" and r["outcome"] == Outcome.FAILED.value
                     for r in prior)
        log.info("job %s already ended at step %d: nothing to run, delivering the %d "
                 "record(s) still pending", self.job_id, end["step"],
                 self.outbox.pending_count())
        self.last_step = int(end["step"])
        return JobResult(job_id=self.job_id, run_dir=self.run_dir,
                         exit_code=1 if failed else 0, final_step=self.last_step,
                         recoveries=[], delivered=False)

    def _loop(self) -> JobResult:
        while True:
            self._handle_deaths()
            self._emit_deaths(block=False)
            if self.state == JobState.FAILED:
                return self._result(1)
            if self.pool.cut_off is not None:
                return self._stop_cut_off(self.pool.cut_off)
            now = time.monotonic()
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
            if self.loans is not None:
                self._handle_loans(now)
            # Progress first: a commit this loop was late to read (the supervisor itself
            # descheduled on a loaded machine) is not a stall of the job.
            self._handle_progress()
            self._handle_watch(now)
            self._handle_checkpoint_errors()
            if self.store.check([P.KEY_DONE]):
                return self._finish(int(self.store.get(P.KEY_DONE)))
            if now - self._last_status > 1.0:
                self._write_status(JobState.RUNNING)
            # A recovery in progress defers it (see _replenish); a second death during it
            # gets a spare from _recover.
            self._replenish()
            time.sleep(0.005)

    # ----------------------------------------------------------------- failures
    def _build_failure(self, failure_class: FailureClass, cause: str, slots: list[str],
                       step: int, detail: str, detected: float,
                       event_id: str | None = None, occurred_at: str | None = None
                       ) -> dict[str, Any]:
        gpu = self.gpu_of.get(slots[0]) if slots else None
        node = (self.pool.node_of(slots[0]) if slots else None) or self.node
        rec = R.failure(contract_id=self.cfg.contract_id, job_id=self.job_id,
                        failure_class=failure_class.value, cause=cause, node=node,
                        gpu=gpu, step=step, detail=detail,
                        occurred_at=occurred_at or wall_date(detected))
        if event_id is not None:
            rec["event_id"] = event_id  # the id its draft was journalled under
        return rec

    def _failure_record(self, failure_class: FailureClass, cause: str, slots: list[str],
                        step: int, detail: str, detected: float,
                        event_id: str | None = None, occurred_at: str | None = None
                        ) -> dict[str, Any]:
        rec = self._build_failure(failure_class, cause, slots, step, detail, detected,
                                  event_id, occurred_at)
        self._emit(rec)
        log.warning("failure %s/%s on %s at step %d: %s", failure_class, cause,
                    ",".join(slots) or "-", step, detail)
        return rec

    def _open_incident(self, failure_class: FailureClass, cause: str, slots: list[str],
                       step: int, detail: str, detected: float | None = None) -> Incident:
        detected = detected or time.monotonic()
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
                if not self.pool.exiting(slot):
                    continue  # alive
                if not (self.store.check([P.left_key(slot)])
                        or self.store.check([P.finished_key(slot)])
                        or self._gone_after_the_end(slot)):
                    out.append((slot, None))  # killed or crashing: act now, classify later
                continue  # an orderly exit is judged by its exit status once reaped
            finished = self.store.check([P.finished_key(slot)])
            if self.store.check([P.left_key(slot)]) or finished:
                # Left on purpose after a move, or finished: a member that marked its last
                # step committed has nothing left to lose, so a crash in its teardown (gloo
                # aborts when a finished peer closes its sockets first) is not a failure.
                if finished and rc != 0:
                    log.warning("%s exited with status %s after finishing its last step", slot, rc)
                self.retired.add(slot)
                self.moving.discard(slot)
                continue
            if not self._gone_after_the_end(slot, rc):
                out.append((slot, rc))
        return out

    def _gone_after_the_end(self, slot: str, rc: int | None = None) -> bool:
        """True (and ``slot`` retired) when a member died before its own finished mark
        but after a peer of its generation had marked the job's last step finished: that
        step was committed (the peer's allreduce had its gradient), nothing is lost and
        nothing is left to recover, so it is not a failure of the job (a log line). Its
        peers waiting in the end-of-job barrier are told not to wait for it."""
        if slot not in self.members or not any(
                self.store.check([P.finished_key(m)]) for m in self.members if m != slot):
            return False
        log.warning("%s died (exit %s) after the job's last step was committed: nothing "
                    "to recover", slot, "unknown yet" if rc is None else rc)
        self.store.set(P.gone_key(slot), "1")
        self.gone.add(slot)
        self.retired.add(slot)
        self.moving.discard(slot)
        return True

    def _fence_lost_nodes(self) -> None:
        for nf in self.pool.take_node_failures():
            # A whole node at once: its processes die in this pass, one incident, with
            # the node's cause (node_lost, or hang for a silent node), dated when the
            # node was last known alive.
            for slot in nf.slots:
                self._fence(slot, Fence(cause=nf.cause, detail=nf.detail, since=nf.since))

    def _handle_deaths(self) -> None:
        self._fence_lost_nodes()
        dead = self._dead_members()
        if not dead:
            return
        # Polling the members (a remote process's poll refreshes the node pool) may itself
        # have noticed a node's loss: fence its slots before the death is drafted, or the
        # draft -- what --resume records if the coordinator dies within the merge window --
        # would call the node's loss a kill (seen under load in test_partition_real).
        self._fence_lost_nodes()
        # A hang began when progress stopped, not when it was fenced: the stall counts
        # in the recovery time.
        detected = death_detected_at(time.monotonic(), [f.since for s, _ in dead
                                                         if (f := self.fenced.get(s))])
        self._handle_progress()  # the step reached, as of now
        # A recovery whose new generation is ready (it has trained a step) is over, though
        # this loop may not have polled it yet (the store is polled less often than deaths
        # are looked for, and a loaded machine delays both): close it first, so that a
        # death in that generation is a failure of its own, at the step it happened, and
        # not folded into the recovered one (which would then be recorded as this death's
        # outcome, at a step before it).
        if self.recovery.active:
            self._handle_ready()
        # Deaths of one incident (a node, a replica group, the whole job: seen one
        # process at a time) within MERGE_WINDOW_S of its detection join it -- one
        # failure, one outcome -- and the recovery is planned again from all of them. A
        # later death during the recovery is a failure of its own naming the first.
        for slot, _ in dead:
            self.retired.add(slot)
            self.moving.discard(slot)
        slots = [s for s, _ in dead]
        self.watch.forget_fault()
        self._carry_out_deaths(self.deaths.step(Died(
            slots=tuple(slots), members=tuple(s for s in slots if s in self.members),
            detected=detected, occurred_at=wall_date(detected), step=self.last_step,
            gen=self.gen, view=self.death_view), time.monotonic()))

    def _carry_out_deaths(self, actions: list[DeathAction], *,
                          step_s: float | None = None) -> None:
        """Do what the deaths' machine (runtime.deaths) asked, in its order (``step_s``:
        the step time outcomes carry, else the one measured)."""
        for act in actions:
            if isinstance(act, Journal):
                self.outbox.write_drafts([
                    self._build_failure(FailureClass.UNPLANNED, d.cause, d.incident.slots,
                                        d.incident.step, d.detail, d.incident.detected,
                                        d.incident.event_id, d.incident.occurred_at)
                    for d in act.drafts])
            elif isinstance(act, Recover):
                if act.new:
                    self.killed_at = self._read_killed_at()
                self._recover(act.incident, list(act.dead))
            elif isinstance(act, WriteFailure):
                inc = act.incident
                self.last_step = max(self.last_step, inc.step)
                self._failure_record(FailureClass.UNPLANNED, act.cause, inc.slots, inc.step,
                                     act.detail, inc.detected, inc.event_id,
                                     inc.occurred_at)
            else:
                self._write_outcomes(act, step_s or self.step_seconds)

    def _write_outcomes(self, act: WriteOutcomes, step_s: float) -> None:
        """One outcome record for each incident ``act`` closes (the machine gives each
        one, once), dated and timed on this supervisor's monotonic clock."""
        done = time.monotonic()
        for inc in act.incidents:
            self._emit(R.outcome(contract_id=self.cfg.contract_id, failure_event_id=inc.event_id,
                                 outcome=act.outcome.value, lost_steps=act.lost_steps,
                                 recovery_seconds=max(done - inc.detected, 0.0),
                                 step_seconds=max(step_s, 1e-6),
                                 gpus_affected=(self.cfg.workers
                                                if act.outcome == Outcome.FAILED
                                                else len(self.members))))

    def _steps_committed_in(self, gen: int) -> int:
        """The last step generation ``gen`` reported (rank 0's progress), as far as the
        store shows: KEY_PROGRESS while no newer generation has overwritten it, and what
        its rank 0 noted as it joined a newer one (protocol.committed_key)."""
        steps = [-1]
        if self.store.check([P.KEY_PROGRESS]):
            prog = json.loads(self.store.get(P.KEY_PROGRESS))
            if int(prog.get("gen", gen)) <= gen and prog.get("slot") not in self.fenced:
                steps.append(int(prog["step"]))
        if gen >= 0 and self.store.check([P.committed_key(gen)]):
            steps.append(int(self.store.get(P.committed_key(gen))))
        return max(steps)

    def _emit_deaths(self, *, block: bool) -> None:
        """Write the failure records of deaths already acted on, once their merge window
        has closed and their exit status is known (``block``: now, waiting for the exit
        status, as an outcome must follow its failure)."""
        self._carry_out_deaths(self.deaths.step(Poll(block=block, view=self.death_view),
                                                time.monotonic()))

    def _read_killed_at(self) -> float | None:
        if self.store.check([P.KEY_KILLED_AT]):
            t = float(self.store.get(P.KEY_KILLED_AT))
            self.store.delete_key(P.KEY_KILLED_AT)
            return t
        return None

    def _recover(self, inc: Incident, dead: list[str]) -> None:
        """Plan and publish the next generation after ``dead`` died (``inc`` joins the
        recovery): the decision is :func:`runtime.coordinator.plan_recovery`'s; this
        gathers what it is decided from and does what it asks (start spares, borrow a
        host, look up the checkpoint, start the plan's new processes)."""
        rec = self.recovery
        rec.incidents.append(inc)
        if too_many_recoveries(len(self.recoveries), len(rec.incidents),
                               self.cfg.max_recoveries):
            self._fail("too many recoveries")
            return
        survivors = [m for m in self.members if m not in dead and self._alive(m)]
        transparent = self.store.get(P.KEY_TRANSPARENT).decode() \
            if self.store.check([P.KEY_TRANSPARENT]) else None
        spares = []
        for s in self.spares:
            alive = self._alive(s)
            spares.append(SpareView(slot=s, alive=alive, shard=self.shard_of.get(s, 0),
                                    ready=alive and self.store.check([P.waiting_key(s)])))
        view = RecoveryView(
            members=tuple(self.members), dead=tuple(dead),
            survivors=tuple(survivors),
            holders=tuple(m for m in survivors if m in self.holders),
            spares=tuple(spares), last_step=self.last_step, shards=self.cfg.shards,
            shard_of=dict(self.shard_of),
            replace_spares=bool(self.cfg.spares and self.cfg.replenish_spares),
            can_borrow=self.loans is not None, room=self.pool.room(),
            transparent=transparent, outcome=rec.outcome, lost_steps=rec.lost_steps)
        while True:
            step = plan_recovery(view)
            if isinstance(step, StartSpares):
                # A death during a recovery (the spare just called in, or another
                # member) finds the spares already used: start replacements now (forked
                # from the zygote: ~0.1 s) rather than roll back while a replica holds
                # the state.
                started = []
                for _ in range(step.count):
                    extra = self._spawn()
                    log.warning("no spare left for %s: started %s", ", ".join(dead), extra)
                    self.spares.append(extra)
                    started.append(SpareView(slot=extra, alive=True, ready=False,
                                             shard=self.shard_of[extra]))
                view = replace(view, spares=(*view.spares, *started),
                               room=self.pool.room())
            elif isinstance(step, Borrow):
                # No spare of its own: a host of a lower-priority job (runtime.borrowing).
                got = self._borrow(step.count, inc)
                view = replace(view, borrowed=True, room=self.pool.room(), spares=(
                    *view.spares, *(SpareView(slot=s, alive=True, ready=False,
                                              shard=self.shard_of[s]) for s in got)))
            elif isinstance(step, NeedCheckpoint):
                found = self._latest_ckpt()
                view = replace(view, checkpoint_known=True, checkpoint=(
                    (found[0], str(found[1])) if found is not None else None))
            elif isinstance(step, FailJob):
                self._fail(step.why)
                return
            else:
                break
        if step.gone_shards and step.checkpoint is not None:
            log.warning("shard(s) %s lost in every replica group: rolling back to the "
                        "checkpoint of step %d", list(step.gone_shards), step.checkpoint[0])
        new: dict[NewProcess, str] = {}
        for start in step.starts:
            new[start] = self._spawn(start.shard)
            if start.spare:
                log.warning("no spare for shard %d of %s: started %s", start.shard,
                            start.replaces, new[start])
        members = [new[m] if isinstance(m, NewProcess) else m for m in step.members]
        for s in step.called_in:
            self.spares.remove(s)
        ck = step.checkpoint
        plan = P.Plan(gen=self.gen + 1, mode=step.mode, members=members,
                      ckpt=ck[1] if ck is not None else None,
                      ckpt_step=ck[0] if ck is not None else None)
        rec.outcome, rec.lost_steps = step.outcome, step.lost_steps
        if ck is not None:
            rec.rollback_step = ck[0]
            rec.absorbed = step.absorbed
        # The checkpoint a rollback goes back to is the newest one written by now (a
        # write that failed earlier may have been followed by one that succeeded).
        source = f" from the checkpoint of step {ck[0]}" if ck is not None else ""
        if self.cfg.shards > 1:
            log.warning("generation %d: %s recovery%s (HSDP, %d shards), members %s",
                        plan.gen, plan.mode, source, self.cfg.shards, members)
        else:
            log.warning("generation %d: %s recovery%s, members %s", plan.gen, plan.mode,
                        source, members)
        rec.gen = plan.gen
        self._publish(plan)

    # ----------------------------------------------------------------- loans
    def _loan_view(self) -> JobView:
        """The job as spare borrowing's decisions see it (runtime.loans)."""
        return JobView(gen=self.gen, members=tuple(self.members), spares=tuple(self.spares),
                       busy=self.recovery.active or self.recovery.gen is not None
                       or bool(self.moving))

    def _handle_loans(self, now: float) -> None:
        """Serve the pool (runtime.borrowing.Loans.poll) and carry out each decision
        about the job it yields: lend a host, start or restart the processes that widen
        the job again, plan the wider generation, write a loan's outcome."""
        if self.loans is None:
            return
        for act in self.loans.poll(self._loan_view, now):
            self._carry_out_loan(act)

    def _carry_out_loan(self, act: LoanAction) -> None:
        loans = self.loans
        if loans is None:
            return
        if isinstance(act, Lend):
            for s in act.spares_on:
                self.spares.remove(s)
            self.retired.update((*act.on, *act.spares_on))
            inc = None
            if act.gen is not None and act.detail is not None:
                inc = self._open_incident(FailureClass.PLANNED, CAUSE_LENT, list(act.on),
                                          self.last_step, act.detail)
                self.recovery = Recovery(gen=act.gen)  # no incident: the shrink loses nothing
                self._publish(P.Plan(gen=act.gen, mode=P.PlanMode.LIVE,
                                     members=list(act.stay)))
                # The step watchdog re-arms at the first step of gen.
                self.watch.step(Disarm(), time.monotonic())
            loans.lent(act, failure_event_id=inc.event_id if inc else None,
                       since=inc.detected if inc else time.monotonic())
        elif isinstance(act, StartReplacements):
            loans.started(act.host, [self._spawn() for _ in range(act.count)])
        elif isinstance(act, RestartDead):
            # One died before it was called in (no member: nothing was lost).
            loans.restarted(act.host, {d: self._spawn() for d in act.dead})
        elif isinstance(act, Grow):
            self.recovery = Recovery(gen=act.gen)
            # A move plan: rank 0 sees it at its next step and the members switch at
            # that step's boundary (a lone member's collectives never wait, so it
            # would not notice a live plan until its end).
            self._publish(P.Plan(gen=act.gen, mode=P.PlanMode.MOVE, members=list(act.members)))
            self.watch.step(Disarm(), time.monotonic())  # (re-armed when it steps)
        elif isinstance(act, CloseLoan):
            # Measured by this supervisor alone, on its monotonic clock (as every
            # recovery_seconds): from the shrink to the first step at full width.
            self._emit(loan_outcome(contract_id=self.cfg.contract_id,
                                    failure_event_id=act.failure_event_id,
                                    seconds=act.seconds, step_seconds=self.step_seconds,
                                    gpus=act.gpus))

    def _borrow(self, count: int, inc: Incident) -> list[str]:
        """Borrow hosts of lower-priority jobs for ``count`` processes and start them there
        (spares, not ready yet); the incident's detail names the hosts. Returns the new
        slots (fewer, or none, when the pool has no host to lend)."""
        if self.loans is None:
            return []
        hosts = self.loans.borrow(count)
        slots: list[str] = []
        for h in hosts:
            for _ in range(h.count):
                slots.append(self._spawn())
                self.spares.append(slots[-1])
        if hosts:
            inc.note = borrowed_note([h.describe() for h in hosts])
        return slots

    def _close_loans(self) -> None:
        """The job ends: the loans still open get their outcome (before job_finished)."""
        if self.loans is None:
            return
        for act in self.loans.close(self.gen, time.monotonic()):
            self._carry_out_loan(act)

    def _latest_ckpt(self) -> tuple[int, Path] | None:
        if self.cfg.shards > 1:  # a DCP folder renamed into place once every shard is in
            return latest_sharded_checkpoint(self.ckpt_dir) \
                if self.cfg.checkpoint_every else None
        if self.store.check([P.KEY_CKPT]):
            info = json.loads(self.store.get(P.KEY_CKPT))
            if Path(info["path"]).exists():
                return int(info["step"]), Path(info["path"])
        return latest_checkpoint(self.ckpt_dir) if self.cfg.checkpoint_every else None

    def _fail(self, why: str) -> None:
        log.error("job %s failed: %s", self.job_id, why)
        # The records first: the steps lost are every step reached, as they say.
        self._emit_deaths(block=True)
        self._carry_out_deaths(self.deaths.step(Resolve(
            view=self.death_view, outcome=Outcome.FAILED, lost_steps=self.last_step),
            time.monotonic()))
        self._close_loans()  # open loans get their outcome before the end
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
                self.watch.step(FaultReported(slot=slot, error=report.error),
                                time.monotonic())

    def stalled_s(self) -> float:
        """Seconds since the job last committed a step (0.0 while the step watchdog is
        not armed: before the first step, or until a planned change's first step)."""
        return self.watch.stalled_s(time.monotonic())

    def step_deadline(self) -> float:
        """The hang deadline of an ordinary step (:meth:`StallWatch.hang_deadline` without the
        checkpoint steps' allowance: a host's heartbeats do not pause while it writes a
        checkpoint), which :func:`runtime.detection.node_deadline` keeps a silent host's
        deadline above."""
        return self.watch.step_deadline()

    def _handle_watch(self, now: float) -> None:
        """One poll of the stall watch (runtime.watchdog.StallWatch: the step watchdog and
        the blame for a reported collective fault); carry out what it decides."""
        tick = Tick(view=self.watch_view, members=tuple(self.members),
                    recovering=self.recovery.active, last_step=self.last_step,
                    step_seconds=self.step_seconds)
        for act in self.watch.step(tick, now):
            if isinstance(act, FenceHung):
                self._fence_hung(list(act.slots), act.why, act.since)
            elif isinstance(act, FenceReporter):
                log.error("%s's collective failed (%s) and no peer is stuck: fencing %s",
                          act.slot, act.error, act.slot)
                self._fence(act.slot, Fence(cause="collective_error", detail=act.error))
                self.pool.kill(act.slot)
            else:
                log.warning("step %d has not advanced for %.1f s, but %s: cannot tell which "
                            "rank is stuck; waiting", self.last_step, act.stalled,
                            "every member is silent" if act.every_member_silent
                            else "every member is waiting")

    def _fence_hung(self, slots: list[str], why: str, since: float | None) -> None:
        """Kill ``slots`` (stuck: not making progress, not reporting) so that the death
        path replaces them; their failure is recorded with cause ``hang`` (its stall,
        from ``since``, counts in the recovery)."""
        for slot in slots:
            log.error("%s is hung at step %d (%s): fencing it (SIGKILL)", slot,
                      self.last_step, why)
            self._fence(slot, Fence(cause="hang", detail=f"{slot} hung at step "
                                    f"{self.last_step}: {why}", since=since))
            self.pool.kill(slot)

    def _fence(self, slot: str, fence: Fence) -> None:
        """Count ``slot`` dead without seeing it die, and tell it so in the store
        (:func:`runtime.protocol.fenced_key`) before any generation that excludes it is
        published: if it runs again (a frozen host thawed, a cut link healed) it exits
        without writing anything, and its progress is refused here."""
        self.fenced[slot] = fence
        self.store.set(P.fenced_key(slot), json.dumps(
            {"gen": self.gen, "cause": fence.cause, "detail": fence.detail[:300]}))

    def _handle_ready(self) -> None:
        rec = self.recovery
        if rec.gen is None or not self.store.check([P.ready_key(rec.gen)]):
            return
        timing = json.loads(self.store.get(P.ready_key(rec.gen)))
        # Rank 0's clock of the new generation (plan seen, group formed, state synced,
        # first step done): what the benchmarks split a recovery into.
        log.info("generation %d ready: %s", rec.gen, json.dumps(timing))
        step_s = self.step_seconds or float(timing["step_seconds"])
        # Measured by one party on one clock: this supervisor's monotonic clock, from the
        # detection to the moment it sees the new generation's first completed step (the
        # worker's wall clock, on another host, is never subtracted from this one's).
        acts = self.deaths.step(Resolve(view=self.death_view), time.monotonic())
        self._carry_out_deaths(acts, step_s=step_s)
        for act in acts:
            if isinstance(act, WriteOutcomes):
                self.recoveries += [{
                    "outcome": act.outcome.value, "class": inc.failure_class.value,
                    "cause": inc.cause, "lost_steps": act.lost_steps,
                    "detected": wall_time(inc.detected), "killed_at": self.killed_at,
                    **timing} for inc in act.incidents]
        self.holders = set(self.members)
        self.watch.step(GenerationReady(), time.monotonic())

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
            mv = self._admit_signal(sig)
            if mv is not None:
                # A second warning about a worker already queued or leaving: nothing new.
                self.move_queue.step(Asked(move=mv, moving=frozenset(self.moving)),
                                     time.monotonic())

    def _admit_signal(self, sig: Signal) -> Move | None:
        """Check a telemetry signal at the door: the worker it names must be a member,
        its cause is normalised to the ledger's form, and the failure record it would
        become must pass the record rules now (an empty detail gets a default). Returns
        the move to make, or None (with a log line) -- never raises."""
        slot = sig.worker
        if slot is None and sig.gpu is not None:
            slot = next((m for m in self.members if self.gpu_of.get(m) == sig.gpu), None)
            if slot is None:
                return None  # a GPU this job does not use
        if slot is None or slot not in self.members:
            log.warning("telemetry signal %r for %s ignored: not a member of this job "
                        "(members: %s)", sig.cause, slot or "no worker",
                        ", ".join(self.members))
            return None
        if self.move_queue.queued(slot) or slot in self.moving:
            return None  # (checked again by the queue; here it spares the record check)
        cause = normalise_cause(sig.cause)
        if cause != sig.cause:
            log.warning("telemetry signal cause %r normalised to %r", sig.cause, cause)
        detail = sig.detail.strip()[:500] or f"telemetry signal {cause or sig.cause!r} on {slot}"
        try:
            R.failure(contract_id=self.cfg.contract_id, job_id=self.job_id,
                      failure_class=FailureClass.PREEMPTIVE.value, cause=cause,
                      node=self.pool.node_of(slot) or self.node,
                      gpu=self.gpu_of.get(slot), step=self.last_step,
                      detail=detail)
        except RecordError as exc:
            log.warning("telemetry signal refused (the ledger would refuse its record): "
                        "%s; signal %r", exc, sig)
            return None
        return Move(slot=slot, failure_class=FailureClass.PREEMPTIVE, cause=cause,
                    detail=detail, detected=time.monotonic())

    def _handle_drains(self) -> None:
        for req in take_requests(self.control_dir):
            slot = str(req.get("worker"))
            if slot in self.spares:
                self.spares.remove(slot)  # draining an idle spare: just retire it
                self.retired.add(slot)
                self.pool.kill(slot)
                continue
            if slot not in self.members:
                log.warning("drain request for unknown worker %s ignored", slot)
                continue
            # Dated when the operator asked (the request's own time, never in the future).
            try:
                asked = min(float(req.get("t") or 0.0), time.time()) or time.time()
            except (TypeError, ValueError):
                asked = time.time()
            asked = mono_time(asked)  # the request's own (wall) date, on this clock
            mv = Move(slot=slot, failure_class=FailureClass.PLANNED, cause="maintenance",
                      detail=str(req.get("reason") or "").strip()[:500] or "drain",
                      detected=asked)
            if self.move_queue.step(Asked(move=mv, moving=frozenset(self.moving)),
                                    time.monotonic()):
                log.warning("drain request for %s ignored: it is already moving or "
                            "queued to move", slot)

    def _handle_moves(self) -> None:
        if not self.move_queue.pending or self.recovery.active:
            return  # (the queue would wait too; this spares the look at the spares)
        acts = self.move_queue.step(MovePoll(
            members=tuple(self.members), ready=tuple(self._ready_spares()),
            shard_of=dict(self.shard_of), spares=len(self.spares),
            spares_coming=bool(self.cfg.spares and self.cfg.replenish_spares),
            recovering=self.recovery.active), time.monotonic())
        for act in acts:
            mv = act.move
            if isinstance(act, NoSpare):
                log.warning("%s move off %s queued: the job has no spare (status.json "
                            "lists it under moves_pending)", mv.failure_class, mv.slot)
            elif isinstance(act, Dropped):
                log.warning("%s move off %s dropped: no longer a member", mv.failure_class,
                            mv.slot)
            elif isinstance(act, StartMove):
                self._start_move(act)

    def _start_move(self, act: StartMove) -> None:
        """Open the move's incident (recorded now) and publish its plan."""
        mv, spare, members = act.move, act.spare, list(act.members)
        self.spares.remove(spare)
        donors = list(act.donors)
        inc = self._open_incident(mv.failure_class, mv.cause, [mv.slot], self.last_step,
                                  mv.detail, mv.detected)
        self.recovery = Recovery(incidents=[inc], gen=self.gen + 1,
                                 outcome=Outcome.LIVE_MIGRATED)
        self.moving.add(mv.slot)
        self.killed_at = None
        # Every generation change is logged, moves included (not only recoveries).
        log.warning("generation %d: %s move off %s onto %s, members %s", self.gen + 1,
                    mv.failure_class, mv.slot, spare, members)
        self._publish(P.Plan(gen=self.gen + 1, mode=P.PlanMode.MOVE, members=members,
                             donors=donors))

    # ----------------------------------------------------------------- progress & end
    def _handle_progress(self) -> None:
        if not self.store.check([P.KEY_PROGRESS]):
            return
        prog = json.loads(self.store.get(P.KEY_PROGRESS))
        if prog.get("slot") in self.fenced:
            return  # a fenced rank 0 that came back: not the job's progress (refused)
        now = time.monotonic()
        seen = (int(prog.get("gen", -1)), int(prog["step"]))
        self.watch.step(Committed(gen=seen[0], step=seen[1], current_gen=self.gen,
                                  recovering=self.recovery.active), now)
        self.last_step = max(self.last_step, int(prog["step"]))
        self.step_seconds = float(prog["step_seconds"])
        if now - self._last_progress_emit >= self.cfg.progress_interval_s \
                and self.last_step != self._progress_step_emitted:
            self._last_progress_emit = now
            self._progress_step_emitted = self.last_step
            self._emit(R.job_progress(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                      step=self.last_step,
                                      step_seconds=max(self.step_seconds, 1e-6)))

    def _handle_checkpoint_errors(self) -> None:
        """Log a failed checkpoint write (an ERROR line, where the operator sees the
        supervisor's log) and show it in status.json until a newer checkpoint is
        published; the rollback target stays the newest checkpoint actually written, so
        a later rollback's lost steps are the true ones."""
        count = int(self.store.add(P.KEY_CKPT_ERRORS, 0))
        if count != self._ckpt_errors_seen and self.store.check([P.KEY_CKPT_ERROR]):
            self._ckpt_errors_seen = count
            err = json.loads(self.store.get(P.KEY_CKPT_ERROR))
            ck = self._latest_ckpt()
            self.checkpoint_error = {"step": int(err["step"]), "error": str(err["error"]),
                                     "failed_writes": count,
                                     "newest_checkpoint": ck[0] if ck else None}
            log.error("CHECKPOINT WRITE FAILED at step %d (%s); %d failed so far. A rollback "
                      "now goes back to %s. Free space (or fix permissions) under %s",
                      err["step"], err["error"], count,
                      f"the checkpoint of step {ck[0]}" if ck else "step 0 (no checkpoint)",
                      self.ckpt_dir)
            self._write_status(JobState.RUNNING)
        elif self.checkpoint_error is not None and self.store.check([P.KEY_CKPT]):
            step = int(json.loads(self.store.get(P.KEY_CKPT))["step"])
            if step > self.checkpoint_error["step"]:
                log.warning("checkpoints written again (step %d) after %d failed write(s)",
                            step, self.checkpoint_error["failed_writes"])
                self.checkpoint_error = None
                self._write_status(JobState.RUNNING)

    def _finish(self, step: int) -> JobResult:
        self._handle_ready()
        self._close_at_the_end(step)
        self.last_step = step
        self._close_loans()  # open loans get their outcome before the end
        self._emit(R.job_finished(contract_id=self.cfg.contract_id, job_id=self.job_id,
                                  step=step))
        deadline = time.monotonic() + self.cfg.finish_timeout_s
        for slot in self.members:
            p = self.pool.procs[slot]
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        # A member that died after the last commit lost nothing (see _gone_after_the_end);
        # any other exit status but 0 (e.g. the script failing after its loop) is an error.
        bad = [s for s in self.members if s not in self.gone
               and self.pool.procs[s].returncode not in (0, None)]
        if bad:
            # Every step is committed and recorded (job_finished); what failed is the
            # process after its loop (the script's own work: saving its output), or a
            # kill that came then. Said, so that the exit status is not read as lost steps.
            log.error("job %s committed every step (%d), but %s: exit 1 (what the script "
                      "does after its loop may not be done)", self.job_id, step,
                      ", ".join(f"{s} exited {self.pool.procs[s].returncode} after the end"
                                for s in bad))
        return self._result(0 if not bad else 1)

    def _close_at_the_end(self, step: int) -> None:
        """Give every failure still without an outcome one, now that the job's last step
        (``step``) is committed: the job ended with every step, so none was lost.

        Members that find a newer generation while finishing join it (Job.steps), so a
        recovery published during the last step normally completes and is closed by
        :meth:`_handle_ready`. What can still be open here is a move published after
        rank 0's last step began (it is served at a step boundary, and there was none
        left): the job ended on its old members with every step committed. Such a
        failure is resolved without a move: ``live_migrated``, 0 lost steps,
        ``recovery_seconds`` up to the end (documented in docs/runtime.md)."""
        self._emit_deaths(block=True)
        if not self.recovery.active:
            return
        for inc in self.recovery.incidents:
            log.warning("failure %s (%s) was still recovering when the job's last step "
                        "(%d) was committed: closed with 0 steps lost", inc.event_id,
                        inc.cause, step)
        acts = self.deaths.step(Resolve(view=self.death_view,
                                        outcome=Outcome.LIVE_MIGRATED, lost_steps=0),
                                time.monotonic())
        self._carry_out_deaths(acts)
        now = time.monotonic()
        for act in acts:
            if isinstance(act, WriteOutcomes):
                self.recoveries += [{
                    "outcome": act.outcome.value, "class": inc.failure_class.value,
                    "cause": inc.cause, "lost_steps": 0, "detected": wall_time(inc.detected),
                    "killed_at": self.killed_at, "first_step": wall_time(now), "step": step}
                    for inc in act.incidents]
        # Members of the unfinished generation (a spare called in) must not be waited for.
        self.members = [m for m in self.members
                        if self.store.check([P.finished_key(m)]) or not self._alive(m)]
        with contextlib.suppress(Exception):
            self.store.set(P.KEY_SHUTDOWN, "1")

    def _result(self, code: int) -> JobResult:
        self._write_status(JobState.FAILED if code else JobState.FINISHED)
        return JobResult(job_id=self.job_id, run_dir=self.run_dir, exit_code=code,
                         final_step=self.last_step, recoveries=self.recoveries,
                         delivered=False, checkpoint_error=self.checkpoint_error)

    def _shutdown(self) -> None:
        self._beating.clear()
        if self.state == JobState.STOPPED:
            return  # _stop_cut_off ended what it could reach; the job is not over
        with contextlib.suppress(Exception):
            self.store.set(P.KEY_SHUTDOWN, "1")
        self.pool.shutdown()

    def _stop_cut_off(self, why: str) -> JobResult:
        """This coordinator cannot reach a majority of its hosts (they went silent
        together: runtime.detection.partition_verdict): it is the one cut off, so it
        blames nobody. It stops beating (every agent's watchdog then stops its host's
        processes and exits 4, on this host too), kills the processes it can reach, and
        ends without recording a failure, an outcome or the job's end -- ``yoco run
        --resume`` on every host, once the network is back, continues the job from its
        newest checkpoint (recording the stop as ``supervisor_lost`` with the true lost
        steps; its detail says why, from ``RUN_DIR/stopped.json``)."""
        log.error("coordinator cut off: %s. Stopping WITHOUT recording any host's failure "
                  "(the hosts are probably healthy); once the network is back, run `yoco "
                  "run --resume` on every host to continue job %s", why, self.job_id)
        self.state = JobState.STOPPED
        self._beating.clear()
        for p in self.pool.procs.values():
            with contextlib.suppress(OSError):
                p.kill()
        note = {"why": why, "at": time.time(), "step": self.last_step}
        try:
            write_json_atomically(self.run_dir / STOPPED_FILE, note)
        except OSError as exc:  # the resume's detail is then generic; nothing is lost
            log.error("cannot write %s: %s", self.run_dir / STOPPED_FILE, exc)
        self._write_status(JobState.STOPPED)
        return JobResult(job_id=self.job_id, run_dir=self.run_dir, exit_code=EXIT_CUT_OFF,
                         final_step=self.last_step, recoveries=self.recoveries,
                         delivered=False)

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
    result.pending = [{"event_id": r["event_id"], "kind": r["kind"]}
                      for r in sup.outbox.pending(limit=1_000_000)]
    result.dead_letters = [{"event_id": d.event_id, "kind": str(d.record.get("kind")),
                            "reason": d.reason} for d in sup.outbox.dead_letters()]
    result.delivered = not result.pending and not result.dead_letters
    result.sink_error = sup.deliverer.last_error
    if not sup.outbox.retry_disk():
        result.outbox_error = sup.outbox.disk_error
        try:
            result.rescued = rescue_held_records(
                sup.outbox, Path(tempfile.gettempdir()) / "yoco-rescued" / sup.job_id)
        except OSError as exc:  # last resort: the records on stderr, one JSON per line
            log.error("cannot rescue the records the outbox could not write (%s); here "
                      "they are:", exc)
            for rec in sup.outbox.held_records():
                print(json.dumps(rec), file=sys.stderr)
    return result
