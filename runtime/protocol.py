"""The store protocol between the supervisor and its workers (keys and plans).

The supervisor owns a ``TCPStore``. Membership changes are *generations*: the
supervisor writes ``g{n}/plan`` and then sets ``gen`` to ``n``; workers watch ``gen``.
Each generation's process group lives under its own prefix ``g{n}/pg/``, so a group
abandoned with a collective still pending can never be confused with the new one.

Fencing: a worker or a host the coordinator fenced (hung, silent, partitioned) is told so
under :func:`fenced_key` / :func:`node_fenced_key`, set *before* any generation that
excludes it is published; a fenced process that comes back (thawed, healed) finds the key
and exits :data:`EXIT_FENCED` without writing anything (docs/runtime.md, "Fencing by
generation").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

# Environment variables the supervisor sets for each worker process.
ENV_STORE = "YOCO_STORE"  # host:port of the supervisor's TCPStore
ENV_SLOT = "YOCO_SLOT"  # this process's worker name (w0, w1, ...)
ENV_RUN_DIR = "YOCO_RUN_DIR"
ENV_FAULTS = "YOCO_FAULTS"
ENV_CKPT_EVERY = "YOCO_CHECKPOINT_EVERY"
ENV_CKPT_DIR = "YOCO_CHECKPOINT_DIR"
ENV_SIGNAL_FILE = "YOCO_SIGNAL_FILE"
ENV_CONTROL_DIR = "YOCO_CONTROL_DIR"
ENV_DEVICE = "YOCO_DEVICE"  # "cpu" or "cuda:N"
ENV_COLLECTIVE_TIMEOUT = "YOCO_COLLECTIVE_TIMEOUT"  # seconds; overrides JobConfig's
ENV_SHARDS = "YOCO_SHARDS"  # HSDP: ranks per replica group (1: plain data parallel)
ENV_SHARD_INDEX = "YOCO_SHARD_INDEX"  # HSDP: the shard this process holds (fixed for life)
# Benchmarks: a directory where each worker appends its recovery timeline (SLOT.jsonl:
# one {"t", "ev", "gen", "step"} line per event); unset, nothing is written.
ENV_TIMELINE = "YOCO_TIMELINE"

#: Exit status of a worker or a node agent that finds itself fenced by the coordinator.
EXIT_FENCED = 5

ENV_NODE = "YOCO_NODE"  # the name of the node (host) the process runs on (multi-node)

#: File in RUN_DIR where rank 0 notes every committed step (see checkpointing.CommittedStep).
COMMITTED_FILE = "committed"

KEY_GEN = "gen"
KEY_PROGRESS = "progress"  # JSON {step, step_seconds, t, gen} from rank 0 after each commit
KEY_CKPT = "ckpt"  # JSON {step, path}: the newest durable checkpoint
# A checkpoint write that failed (full or read-only disk...): rank 0's writer sets the
# error (JSON {step, error}) and counts it; the supervisor logs it and shows it in
# status.json ("checkpoint_error") until a newer checkpoint is published.
KEY_CKPT_ERROR = "ckpt_error"
KEY_CKPT_ERRORS = "ckpt_errors"
KEY_DONE = "done"  # final step, set by rank 0 when the loop ends
KEY_SHUTDOWN = "shutdown"  # spares exit when set
KEY_FAULTS = "faults"  # counter of fault reports
KEY_KILLED_AT = "killed_at"  # wall time an injected kill fired (read by the benchmark)
# Transparent mode (runtime.transparent): set by every worker when it joins. Value "live", or
# "rollback: WHY" when the script's state is not discoverable: the supervisor then recovers
# by rollback only. Either way a rollback's survivors cannot run their interrupted step
# again (the script has moved past its batch): that batch is lost too (one more lost step).
KEY_TRANSPARENT = "transparent/mode"


def transparent_rng_key(rank: int, slot: int) -> str:
    """Transparent mode: rank ``rank``'s RNG states at a step boundary, in one of two
    alternating slots (``slot`` 0 or 1), as JSON (runtime.transparent.worker)."""
    return f"transparent/rng/{rank}/{slot}"


def transparent_joined_key(slot: str) -> str:
    """Transparent mode: set once ``slot`` has joined the job (its script runs steps)."""
    return f"transparent/joined/{slot}"


def transparent_at_key(gen: int) -> str:
    """Transparent mode: where the survivors of a failure are in their scripts (JSON
    ``{calls, pos}``), written before they form rollback generation ``gen``'s groups: a
    replacement in that rollback is placed there (the survivors' data is not rewound)."""
    return f"transparent/at/{gen}"


# ----------------------------------------------------------------- node agents
# Multi-node: one agent per host starts its host's processes for the coordinator (which
# runs the supervisor) and reports what happens to them, through the same store.
KEY_AGENT_EVENTS = "agents/events"  # queue: JSON events of every agent, oldest first
# The job's id, set by the supervisor as soon as it opens the store: an agent that finds
# another job's id (or none) at its rendezvous endpoint refuses to join it.
KEY_JOB = "job"
# The coordinator's liveness: a counter its beat thread adds to every
# COORD_BEAT_INTERVAL_S. An agent whose watchdog sees it not advance for its
# coordinator timeout stops its host's processes and exits 4 (runtime.agent).
KEY_COORD_BEAT = "coordinator/beat"
#: How often the coordinator beats.
COORD_BEAT_INTERVAL_S = 0.1


def node_info_key(rank: int) -> str:
    """Key of node ``rank``'s registration: JSON {name, pid, pgid, machine, nproc}."""
    return f"node/{rank}/info"


def node_beat_key(rank: int) -> str:
    """Key node ``rank``'s agent sets every :data:`NODE_BEAT_INTERVAL_S` (a counter)."""
    return f"node/{rank}/beat"


def node_requests_key(rank: int) -> str:
    """Queue of the coordinator's requests to node ``rank``'s agent (spawn, kill)."""
    return f"node/{rank}/req"


def node_fenced_key(rank: int) -> str:
    """Key the coordinator sets (JSON {cause, detail}) when it fences node ``rank`` (a
    host lost or silent): its agent, if it comes back, kills its processes and exits
    :data:`EXIT_FENCED`."""
    return f"node/{rank}/fenced"


#: How often an agent beats.
NODE_BEAT_INTERVAL_S = 0.1


def node_job_key(rank: int) -> str:
    """Key, in a borrower's store, of what a borrowed node ``rank``'s agent runs there:
    JSON {script, args, python, job} (the borrower's script, not the lender's)."""
    return f"node/{rank}/job"


# ----------------------------------------------------------------- the shared pool
# Spare borrowing (runtime.borrowing): the coordinators of several jobs and their agents
# share one pool store (``yoco pool``, a TCPStore of its own). Each host has one record,
# changed only by compare-and-set, so a host belongs to exactly one job at any time.
KEY_POOL_HOSTS = "pool/hosts"  # counter: how many host names are listed


def pool_host_name_key(index: int) -> str:
    """Key of the ``index``-th host name registered in the pool (0-based)."""
    return f"pool/name/{index}"


def pool_host_key(name: str) -> str:
    """Key of host ``name``'s pool record (JSON :class:`runtime.borrowing.HostRecord`)."""
    return f"pool/host/{name}"


def plan_key(gen: int) -> str:
    """Key of generation ``gen``'s plan."""
    return f"g{gen}/plan"


def group_prefix(gen: int, name: str) -> str:
    """Store prefix under which generation ``gen`` builds its group ``name`` (``pg``: all
    participants; ``train``: the members without the donors); ``gloo/`` and ``nccl/``
    sub-prefixes hold each backend's rendezvous."""
    return f"g{gen}/{name}/"


def ready_key(gen: int) -> str:
    """Key rank 0 sets after the first completed step of generation ``gen``."""
    return f"g{gen}/ready"


def committed_key(gen: int) -> str:
    """Key rank 0 of generation ``gen`` sets to its last committed step: right after each
    update (``Membership.note_committed``, before the step's :data:`KEY_PROGRESS` report,
    which is written later on a reporting thread), and as it joins a newer generation.
    The failed generation's progress, which KEY_PROGRESS may not show yet (every member
    killed right after an update) or no longer shows once the next generation reported."""
    return f"g{gen}/committed"


def skeleton_key(gen: int, src: int) -> str:
    """Key under which source rank ``src`` publishes its state skeleton in ``gen``."""
    return f"g{gen}/skel/{src}"


def no_skeleton_key(gen: int, src: int) -> str:
    """Key rank ``src`` of a live ``gen`` sets while the groups form when it will not
    publish its skeleton ahead (it holds no state, or does not expect to send): a
    newcomer that guessed it as its source stops waiting for that skeleton."""
    return f"g{gen}/noskel/{src}"


def fault_key(slot: str) -> str:
    """Key of the latest fault report of worker ``slot``."""
    return f"fault/{slot}"


def beat_key(slot: str) -> str:
    """Key of worker ``slot``'s heartbeat: ``"GEN STEP TIME"``, written only while it
    waits (for a collective, a transfer, a group, the next generation) longer than
    :data:`BEAT_INTERVAL_S`, so steady training costs no store traffic. A rank that is
    stuck (stopped, hung in a kernel) stops beating while its peers, waiting for it,
    keep beating: that is how the supervisor tells which rank to fence."""
    return f"beat/{slot}"


#: How often a waiting worker writes its heartbeat.
BEAT_INTERVAL_S = 0.2


def fenced_key(slot: str) -> str:
    """Key the coordinator sets (JSON {gen, cause, detail}) when it fences worker ``slot``
    (counts it dead without seeing it die: hung, or on a lost or silent host). The
    worker checks it before each write of its own (committed step, progress, checkpoint,
    marks, fault reports) and exits :data:`EXIT_FENCED` when it is set."""
    return f"fenced/{slot}"


def left_key(slot: str) -> str:
    """Key a worker sets before it leaves on purpose (moved off, or donor done)."""
    return f"left/{slot}"


def finished_key(slot: str) -> str:
    """Key a member sets when its training loop has ended (all steps committed)."""
    return f"finished/{slot}"


def gone_key(slot: str) -> str:
    """Key the supervisor sets for a member that died after a peer had finished the job's
    last step (nothing was lost; the peers waiting in the end-of-job barrier stop
    waiting for its finished mark)."""
    return f"gone/{slot}"


def waiting_key(slot: str) -> str:
    """Key a process sets once it has built its model and waits to be called in."""
    return f"waiting/{slot}"


def fired_key(action: str, step: int, rank: int | None) -> str:
    """Counter that makes an injected fault fire once per job (the first adder wins)."""
    return f"fired/{action}/{step}/{rank}"


def killall_key(step: int) -> str:
    """Key the first rank to reach a ``killall`` step arms with its generation."""
    return f"fired/killall/{step}"


class PlanMode(StrEnum):
    """How the members of a generation get the state (see :class:`Plan`)."""

    START = "start"
    LIVE = "live"
    MOVE = "move"
    ROLLBACK = "rollback"
    RESUME = "resume"

    @property
    def from_checkpoint(self) -> bool:
        """True for the modes in which every member loads a checkpoint."""
        return self in (PlanMode.ROLLBACK, PlanMode.RESUME)


MODES = tuple(m.value for m in PlanMode)


@dataclass(kw_only=True, slots=True)
class Plan:
    """Generation ``gen``: ``members`` in rank order and how they get the state.

    * ``start``: rank 0's initial state is copied to every other rank;
    * ``live`` / ``move``: the ranks holding the highest committed step send it to the
      others (``donors`` are leaving workers that only send);
    * ``rollback`` / ``resume``: everyone loads ``ckpt``.
    """

    gen: int
    mode: PlanMode
    members: list[str]
    donors: list[str] = field(default_factory=list)
    ckpt: str | None = None
    ckpt_step: int | None = None
    # HSDP: ranks per replica group; member p is replica p // shards, shard p % shards.
    shards: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown plan mode {self.mode!r}")
        if self.shards < 1 or len(self.members) % self.shards:
            raise ValueError("members must be a whole number of replica groups")
        self.mode = PlanMode(self.mode)
        if not self.members:
            raise ValueError("a plan needs members")
        if self.mode.from_checkpoint and not self.ckpt:
            raise ValueError("a rollback plan needs a checkpoint")

    def encode(self) -> str:
        """Return the plan as JSON."""
        return json.dumps(asdict(self))

    @staticmethod
    def decode(raw: bytes | str) -> Plan:
        """Parse a plan written by :meth:`encode`."""
        data: dict[str, Any] = json.loads(raw)
        return Plan(**data)


class Phase(StrEnum):
    """Where a worker's collective failed (in a :class:`FaultReport`)."""

    STEP = "step"  # the gradient reduction of a step
    SYNC = "sync"  # the commit vote or the state transfer
    REGROUP = "regroup"  # building the generation's process group
    ROLLBACK = "rollback"  # loading the checkpoint of a rollback/resume plan


@dataclass(kw_only=True, slots=True)
class FaultReport:
    """What a worker whose own collective failed reports under :func:`fault_key`."""

    gen: int
    step: int
    phase: Phase
    error: str

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)

    def encode(self) -> str:
        """Return the report as JSON."""
        return json.dumps(asdict(self))

    @staticmethod
    def decode(raw: bytes | str) -> FaultReport:
        """Parse a report written by :meth:`encode`."""
        data: dict[str, Any] = json.loads(raw)
        return FaultReport(**data)
