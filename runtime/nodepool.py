"""The coordinator's view of the job's processes across hosts: a drop-in for
:class:`runtime.processes.WorkerPool` whose processes are started and watched by the node
agents (:mod:`runtime.agent`), one per host, through the job's ``TCPStore``.

The coordinator (the supervisor on node rank 0) asks an agent to start or kill a process
(a queue per node); agents report every start, every process that begins to die
(``PF_EXITING``) and every exit status on one shared event queue, and beat every 0.1 s.
A node whose agent is gone (its process group killed: power, kernel panic) or silent for
the node deadline (frozen, partitioned: :func:`runtime.detection.node_deadline`: a few
steady steps once the job's steps are known and the job is stalled, else
``node_timeout_s``) is *lost*: every process on it counts as dead at
once, with the cause ``node_lost`` or ``hang``, and a silent node is fenced (its processes
killed where this machine can reach them; elsewhere it is told so under
``node/RANK/fenced`` and each of its processes under ``fenced/SLOT``, before the next
generation excludes them: an agent or a process that wakes up finds that and exits
:data:`runtime.protocol.EXIT_FENCED` without writing anything). A silent node on this
machine whose agent and processes ``/proc`` shows *stopped* (a frozen host: its process
group SIGSTOPped) is fenced sooner, after :func:`runtime.processes.stopped_deadline`
(3 steady steps, at least 0.25 s): a stopped process cannot be merely slow. Silences are
judged together (:func:`runtime.detection.partition_verdict`): when the silent hosts leave
the coordinator without a majority, the coordinator is the one cut off -- it loses nobody,
waits for the full ``node_timeout_s`` (stopping the job costs more than losing a host),
then sets :attr:`NodePool.cut_off`, and the supervisor stops without recording anything.

Placement: each node runs up to ``nproc`` processes (one per GPU). A new process goes to
the lowest-ranked live node with a free place, so the first ``nnodes x nproc`` processes
(the workers) fill the training nodes in rank order and the spares fill the spare nodes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime import protocol as P
from runtime.coordinator import frozen_look_due, host_frozen, quiet_hosts
from runtime.detection import NODE_FLOOR_S, BeatGaps, node_deadline, partition_verdict
from runtime.errors import ConfigError
from runtime.processes import process_exiting, process_stopped, stopped_deadline

log = logging.getLogger("yoco.runtime.nodepool")

#: The coordinator runs on node rank 0.
COORDINATOR_RANK = 0
#: A node that has missed this many heartbeats is *quiet*: the supervisor blames none of
#: the job's processes for a stall or a failed collective while a node is quiet (the
#: node check decides, within the node timeout: the node lost, or this coordinator cut
#: off), so a partition never fences the ranks on the other side one by one as hung.
QUIET_BEATS = 3


def machine_id() -> str:
    """This machine's identity (processes on the same machine can be signalled)."""
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        with contextlib.suppress(OSError), open(path, encoding="ascii") as fh:
            return fh.read().strip()
    return os.uname().nodename


@functools.cache
def _this_machine() -> str:
    return machine_id()  # read once: looked at for every host every 5 ms


@dataclass(kw_only=True, slots=True)
class NodeFailure:
    """A whole node lost at once: what the supervisor records as one incident."""

    node: str
    cause: str  # node_lost (its agent is gone) or hang (silent)
    detail: str
    slots: list[str]
    since: float  # when it was last known alive (the failure's date; time.monotonic())


@dataclass(kw_only=True, slots=True)
class Node:
    """One host as the coordinator sees it."""

    rank: int
    name: str
    pid: int
    pgid: int
    machine: str
    nproc: int
    beat: int = -1
    beat_seen: float = field(default_factory=time.monotonic)  # this host's monotonic clock
    lost: str | None = None  # the cause once lost
    stopped_since: float | None = None  # first look that found it frozen (in a row)
    # Spare borrowing (runtime.borrowing): lent to another job (not placed on, not
    # watched), or borrowed from one (its agent joins later; until then not watched).
    lent: bool = False
    borrowed: bool = False
    joined: bool = True
    join_deadline: float = 0.0

    @property
    def reachable(self) -> bool:
        """True when the node's processes run on this machine (they can be signalled)."""
        return self.machine == _this_machine()


class RemoteProcess:
    """A process on some node, with the part of ``subprocess.Popen``'s interface the
    supervisor uses (``pid``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(self, pool: NodePool, slot: str, node: Node) -> None:
        self._pool = pool
        self.slot = slot
        self.node = node
        self.pid = 0
        self.returncode: int | None = None
        self.exiting = False

    def poll(self) -> int | None:
        """The exit status once known (-9 for a process of a lost node), else None."""
        self._pool.refresh()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; raise ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.slot, timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the process (through its agent; directly too when reachable)."""
        if self.returncode is not None:
            return
        self._pool.request(self.node, {"op": "kill", "slot": self.slot})
        if self.node.reachable and self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)


class NodePool:
    """Every process of a multi-node job, by slot (see the module docstring)."""

    def __init__(self, store: Any, *, nodes: int, node_timeout_s: float,
                 register_timeout_s: float = 300.0, stopped_factor: float = 0.0,
                 step_seconds: Callable[[], float] = lambda: 0.0,
                 node_floor_s: float = NODE_FLOOR_S,
                 step_deadline: Callable[[], float] = lambda: math.inf,
                 stalled: Callable[[], float] = lambda: math.inf) -> None:
        if nodes < 1 or node_timeout_s <= 0 or stopped_factor < 0 or node_floor_s <= 0:
            raise ConfigError("a node pool needs nodes >= 1, node_timeout_s > 0, "
                              "node_floor_s > 0 and stopped_factor >= 0")
        self.store = store
        self.node_timeout_s = node_timeout_s
        # A silent host is lost after node_deadline(...): step_deadline() is the job's
        # adaptive hang deadline of ordinary steps (inf: the node timeout alone), and
        # stalled() how long the job has committed no step (the short deadline needs
        # the job stalled too).
        self.node_floor_s = node_floor_s
        self.step_deadline = step_deadline
        self.stalled = stalled  # seconds since the job last committed a step
        self.beat_gaps = BeatGaps(floor_s=node_floor_s)
        # A frozen node on this machine is fenced after stopped_deadline(step, this)
        # (0: only after node_timeout_s); step_seconds() is the job's steady step.
        self.stopped_factor = stopped_factor
        self.step_seconds = step_seconds
        self.procs: dict[str, RemoteProcess] = {}
        self.nodes = self._wait_for_agents(nodes, register_timeout_s)
        self.zygote = None
        self._next_slot = 0
        self._last_refresh = 0.0
        self._last_beats = 0.0
        self._last_look = 0.0  # when _check_nodes last read the heartbeats
        self._failures: list[NodeFailure] = []
        self._returned: list[str] = []
        self._closing = False
        self.register_timeout_s = register_timeout_s
        # Set (why) once the coordinator found itself cut off from a majority of its
        # hosts (runtime.detection.partition_verdict): it then loses nobody.
        self.cut_off: str | None = None
        self._quiet: set[str] = set()  # nodes silent for QUIET_BEATS beats or more

    def _wait_for_agents(self, n: int, timeout: float) -> list[Node]:
        deadline = time.monotonic() + timeout
        nodes: list[Node] = []
        for rank in range(n):
            key = P.node_info_key(rank)
            while not self.store.check([key]):
                if time.monotonic() > deadline:
                    raise ConfigError(f"node {rank}'s agent did not register within "
                                      f"{timeout:.0f} s (is `yoco run` running there?)")
                time.sleep(0.05)
            info = json.loads(self.store.get(key))
            nodes.append(Node(rank=rank, name=info["name"], pid=int(info["pid"]),
                              pgid=int(info["pgid"]), machine=info["machine"],
                              nproc=int(info["nproc"])))
            log.info("node %d (%s) registered: %d place(s)", rank, info["name"], info["nproc"])
        return nodes

    # ----------------------------------------------------------------- WorkerPool API
    def next_slot(self) -> str:
        """Reserve and return the next slot name."""
        slot = f"w{self._next_slot}"
        self._next_slot += 1
        return slot

    @property
    def started(self) -> int:
        """How many slots were handed out so far."""
        return self._next_slot

    def start_zygote(self, env: Any) -> None:
        """Each agent runs its own spare zygote: nothing to do here."""

    def has_room(self) -> bool:
        """True when some live node has a free place."""
        return self._place() is not None

    def room(self) -> int:
        """How many more processes fit on the live nodes (each :meth:`spawn` takes one
        place: the first live node with a free one)."""
        return sum(max(node.nproc - sum(1 for p in self.procs.values()
                                        if p.node is node and p.returncode is None), 0)
                   for node in self.nodes if node.lost is None and not node.lent)

    def _place(self) -> Node | None:
        for node in self.nodes:
            if node.lost is None and not node.lent and sum(
                    1 for p in self.procs.values()
                    if p.node is node and p.returncode is None) < node.nproc:
                return node
        return None

    def spawn(self, slot: str, env: dict[str, str]) -> None:
        """Start ``slot`` on the first live node with a free place."""
        node = self._place()
        if node is None:
            raise ConfigError(f"no node has a free place for {slot}")
        # A borrowed node's agent has another job's environment: it gets every variable.
        delta = {k: v for k, v in env.items() if k.startswith("YOCO_") and
                 (node.borrowed or os.environ.get(k) != v)}
        self.procs[slot] = RemoteProcess(self, slot, node)
        self.request(node, {"op": "spawn", "slot": slot, "env": delta})

    def request(self, node: Node, req: dict[str, Any]) -> None:
        """Queue ``req`` for ``node``'s agent."""
        if node.lost is None:
            self.store.queue_push(P.node_requests_key(node.rank), json.dumps(req))

    def node_of(self, slot: str) -> str | None:
        """The name of the node ``slot`` runs on."""
        p = self.procs.get(slot)
        return p.node.name if p is not None else None

    def alive(self, slot: str) -> bool:
        """True while ``slot`` runs and is not being torn down."""
        p = self.procs.get(slot)
        return p is not None and p.poll() is None and not p.exiting

    def exiting(self, slot: str) -> bool:
        """True once ``slot`` has started to die (its agent saw PF_EXITING) or is dead."""
        p = self.procs[slot]
        return p.poll() is not None or p.exiting

    def kill(self, slot: str) -> None:
        """SIGKILL ``slot``'s process."""
        self.procs[slot].kill()

    def stopped(self, slot: str) -> bool:
        """True when ``slot``'s process runs on this machine and is stopped while its
        node's agent is not (a hung worker; a frozen node is the node check's case)."""
        p = self.procs.get(slot)
        if p is None or p.returncode is not None or not p.pid or not p.node.reachable \
                or p.node.lost is not None or process_stopped(p.node.pid):
            return False
        return process_stopped(p.pid)
    def adopt(self, name: str, *, rank: int, nproc: int) -> None:
        """Add host ``name``, borrowed from another job, as node ``rank``: processes
        can be placed on it now (its agent serves them once it has joined; a node that
        has not joined within the registration timeout is lost)."""
        assert rank == len(self.nodes)
        self.nodes.append(Node(rank=rank, name=name, pid=0, pgid=0, machine="", nproc=nproc,
                               borrowed=True, joined=False,
                               join_deadline=time.monotonic() + self.register_timeout_s))

    def lend(self, name: str, req: dict[str, Any]) -> None:
        """Hand host ``name`` to another job: ``req`` goes to its agent, and the node is
        neither placed on nor watched until it comes back (:meth:`take_returned`)."""
        node = next(n for n in self.nodes if n.name == name)
        self.request(node, req)
        node.lent = True

    def lose_unjoined(self, node: Node, detail: str) -> None:
        """A borrowed node that will not join (its loan was withdrawn) is lost now."""
        if node.lost is None and not node.joined:
            self._lose(node, "node_lost", detail, time.monotonic())

    def take_returned(self) -> list[str]:
        """Names of the lent hosts that came back since the last call."""
        self.refresh()
        out, self._returned = self._returned, []
        return out

    def quiet_nodes(self) -> set[str]:
        """Names of the live nodes that missed :data:`QUIET_BEATS` heartbeats or more
        (as of the last look at the beats)."""
        self.refresh()
        return set(self._quiet)

    def node_silences(self) -> dict[str, float]:
        """Seconds since each live, joined node's heartbeat was last seen to advance, on
        this machine's monotonic clock (the beats are looked at every 50 ms)."""
        self.refresh()
        now = time.monotonic()
        return {n.name: now - n.beat_seen for n in self.nodes
                if n.lost is None and not n.lent and n.joined}

    def take_node_failures(self) -> list[NodeFailure]:
        """Nodes found lost since the last call (each is one incident)."""
        self.refresh()
        out, self._failures = self._failures, []
        return out

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Wait up to ``grace_s`` for every process to end (the supervisor has set the
        shutdown key, which ends every agent), then kill the rest."""
        self._closing = True  # agents now end on purpose: no node is lost any more
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.monotonic(), 0.05))
            if p.returncode is None:
                p.kill()

    # ----------------------------------------------------------------- events
    def refresh(self) -> None:
        """Read the agents' events and heartbeats (at most every 5 ms / 50 ms)."""
        now = time.monotonic()
        if now - self._last_refresh < 0.005:
            return
        self._last_refresh = now
        n = int(self.store.queue_len(P.KEY_AGENT_EVENTS))
        for _ in range(n):
            self._apply(json.loads(self.store.queue_pop(P.KEY_AGENT_EVENTS, False)))
        if self._closing:
            return
        # A host on this machine whose agent is dying is lost now (a /proc read per host,
        # no store traffic): every 5 ms, not at the 50 ms heartbeat look.
        for node in self.nodes:
            if node.lost is None and node.reachable and process_exiting(node.pid):
                self._lose(node, "node_lost", f"node {node.name} lost: its agent "
                           f"(pid {node.pid}) and its processes are gone", node.beat_seen)
        if now - self._last_beats >= 0.05:
            self._last_beats = now
            self._check_nodes()

    def _apply(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "returned":  # a lent host is back (runtime.borrowing)
            for node in self.nodes:
                if node.name == ev.get("node") and node.lent:
                    node.lent, node.beat, node.beat_seen = False, -1, time.monotonic()
                    self._returned.append(node.name)
            return
        p = self.procs.get(str(ev.get("slot")))
        if p is None or p.returncode is not None:
            return
        if ev["kind"] == "started":
            p.pid = int(ev["pid"])
        elif ev["kind"] == "exiting":
            p.exiting = True
        elif ev["kind"] == "exit":
            p.returncode = int(ev["rc"])

    def _check_nodes(self) -> None:
        for node in self.nodes:
            if node.lost is None and not node.joined:
                self._join(node)
        live = [n for n in self.nodes if n.lost is None and not n.lent and n.joined]
        if not live:
            return
        beats = self.store.multi_get([P.node_beat_key(n.rank) for n in live])
        now = time.monotonic()
        # A host's gap between two heartbeats is at least from the look that saw the
        # first to the look before the one that sees the next: that lower bound leaves
        # out this coordinator's own delays (a late look, this process busy).
        previous, self._last_look = self._last_look, now
        for node, raw in zip(live, beats, strict=True):
            beat = int(raw)
            if beat != node.beat:
                if node.beat >= 0:
                    self.beat_gaps.observe(max(0.0, previous - node.beat_seen), now)
                node.beat, node.beat_seen = beat, now
        self._quiet = quiet_hosts({n.name: now - n.beat_seen for n in live},
                                  quiet_s=QUIET_BEATS * P.NODE_BEAT_INTERVAL_S)
        for node in live:
            if self._frozen(node, now):  # /proc shows it stopped: frozen, not cut off
                self._lose(node, "hang", f"node {node.name} silent for "
                           f"{now - node.beat_seen:.2f} s (no heartbeat), its agent and "
                           "processes stopped (/proc): fenced", node.beat_seen)
        live = [n for n in live if n.lost is None]
        deadline = self.node_deadline(now)
        verdict = partition_verdict({n.rank: now - n.beat_seen for n in live},
                                    self_rank=COORDINATOR_RANK, timeout_s=deadline,
                                    cut_off_s=self.node_timeout_s)
        if verdict.cut_off:
            if self.cut_off is None:
                names = [n.name for n in live if n.rank in verdict.quiet]
                self.cut_off = (f"hosts {', '.join(names)} ({len(names)} of {len(live)}) "
                                f"went silent together for {self.node_timeout_s:.1f} s: this "
                                "coordinator is the one cut off")
                log.error("%s; nobody is blamed", self.cut_off)
            return
        for node in live:
            if node.rank in verdict.lose:
                self._lose(node, "hang", f"node {node.name} silent for "
                           f"{now - node.beat_seen:.2f} s (no heartbeat; lost after "
                           f"{deadline:.2f} s): fenced", node.beat_seen)

    def node_deadline(self, now: float) -> float:
        """Seconds of silence after which a host is lost now
        (:func:`runtime.detection.node_deadline`: at most ``node_timeout_s``)."""
        return node_deadline(timeout_s=self.node_timeout_s, floor_s=self.node_floor_s,
                             longest_gap_s=self.beat_gaps.longest(now),
                             step_deadline_s=self.step_deadline(),
                             stalled_s=max(0.0, self.stalled()))

    def _frozen(self, node: Node, now: float) -> bool:
        """True when ``node`` (on this machine) has been silent for the stopped deadline
        and its agent and every live process of it were found stopped on every look for
        at least half that deadline: frozen, not slow (see the module docstring)."""
        silent = now - node.beat_seen
        if not self.stopped_factor or not node.reachable \
                or not frozen_look_due(silent, P.NODE_BEAT_INTERVAL_S):
            node.stopped_since = None
            return False
        pids = [node.pid] + [p.pid for p in self.procs.values()
                             if p.node is node and p.returncode is None and p.pid]
        if not all(process_stopped(pid) for pid in pids):
            node.stopped_since = None
            return False
        if node.stopped_since is None:
            node.stopped_since = now
        deadline = stopped_deadline(self.step_seconds(), self.stopped_factor)
        return host_frozen(silent_s=silent, stopped_since=node.stopped_since, now=now,
                           deadline_s=deadline)

    def _join(self, node: Node) -> None:
        key = P.node_info_key(node.rank)
        if self.store.check([key]):
            info = json.loads(self.store.get(key))
            node.pid, node.pgid = int(info["pid"]), int(info["pgid"])
            node.machine, node.joined, node.beat_seen = info["machine"], True, time.monotonic()
            log.info("node %d (%s), borrowed, joined", node.rank, node.name)
        elif time.monotonic() > node.join_deadline:
            self._lose(node, "node_lost", f"node {node.name} (borrowed) did not join within "
                       f"{self.register_timeout_s:.0f} s", time.monotonic())

    def _lose(self, node: Node, cause: str, detail: str, since: float) -> None:
        node.lost = cause
        slots = [p.slot for p in self.procs.values()
                 if p.node is node and p.returncode is None]
        log.error("%s; its processes: %s", detail, ", ".join(slots) or "none")
        if node.reachable and node.pgid != os.getpgid(0):
            # Fence: nothing of it may run on (a stopped host that resumes). Never this
            # process's own group (the coordinator's host: its agent is a thread here).
            with contextlib.suppress(OSError):
                os.killpg(node.pgid, signal.SIGKILL)
        for slot in slots:
            self.procs[slot].returncode = -signal.SIGKILL
        # Fenced, and told so before anything excludes it: an agent that comes back (its
        # host thawed, its link healed) finds this, kills its processes and exits
        # EXIT_FENCED (runtime.agent).
        self.store.set(P.node_fenced_key(node.rank), json.dumps(
            {"cause": cause, "detail": detail}))
        self._failures.append(NodeFailure(node=node.name, cause=cause, detail=detail,
                                          slots=slots, since=since))
