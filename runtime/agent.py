"""The node agent: one per host. It starts and watches its host's workers and spares for
the coordinator (the supervisor on node rank 0, :class:`runtime.nodepool.NodePool`), and
heartbeats, all through the job's ``TCPStore`` (no transport of its own).

Every host runs the same ``yoco run --nnodes N[:+S] ... SCRIPT`` (or gets its identity
from Slurm or Kubernetes: :mod:`runtime.identity`); node rank 0 also runs the coordinator.
The agent:

* registers ``node/RANK/info`` (name, pid, process group, machine, places);
* beats every 0.1 s from a thread of its own (``node/RANK/beat``, a counter);
* takes the coordinator's requests from its queue: ``spawn`` (a worker or spare process
  of SCRIPT, forked from its spare zygote, waiting for it if it is still starting),
  ``kill`` and ``lend`` (the
  host goes to another job for a while: ``on_lend``, :func:`runtime.loanagent.serve_loan`);
* reports on the shared event queue each process it started (``started`` with its pid),
  each one that begins to die (``exiting``: the kernel's ``PF_EXITING``, within ~1 ms of
  a SIGKILL) and each exit status (``exit``);
* ends when the job is shut down (the ``shutdown`` key), after its processes.

Its processes share its process group, so a whole host going down (the group killed) or
freezing (the group stopped) is what the coordinator sees as a lost or hung node.

If the coordinator fenced this host (``node/RANK/fenced``: it was silent -- frozen, cut
off -- and its ranks were moved elsewhere) and the host comes back, the agent kills its
processes and exits :data:`runtime.protocol.EXIT_FENCED`.

If the coordinator is lost, the agent kills its processes and exits with
:data:`EXIT_COORDINATOR_LOST`: training without a coordinator would be unrecorded.
``yoco run --resume`` on every host continues the job from its newest checkpoint,
recording the loss (docs/runtime.md, "Coordinator loss"). Lost means: the coordinator's
liveness counter (``coordinator/beat``, advanced every 0.1 s by a thread of the
coordinator) has not advanced for ``coordinator_timeout_s`` (5 s) on this host's
monotonic clock. A watchdog thread decides it (:func:`runtime.detection.coordinator_lost`)
from what the beat thread last read, so no store call, however long it blocks (a
partition: a ``TCPStore`` call with a 5 s timeout was seen blocked for 45 s), can stretch
the deadline: within the timeout plus one watchdog look (50 ms) the host's processes are
SIGKILLed and the agent's process exits 4, whatever its main thread is blocked in.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import protocol as P
from runtime.detection import coordinator_lost
from runtime.errors import ConfigError
from runtime.identity import NodeIdentity
from runtime.nodepool import machine_id
from runtime.processes import WorkerPool, process_exiting

log = logging.getLogger("yoco.runtime.agent")

#: Exit status of an agent whose coordinator was lost.
EXIT_COORDINATOR_LOST = 4

#: How often the coordinator watchdog looks at the last coordinator beat seen.
WATCHDOG_INTERVAL_S = 0.05


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    """One host's agent."""

    identity: NodeIdentity
    job_id: str
    script: str
    args: list[str] = field(default_factory=list)
    nproc: int = 1
    log_dir: Path
    python: str = ""
    fork_spares: bool = True
    connect_timeout_s: float = 300.0
    # The store stopped answering for this long: the coordinator is lost.
    coordinator_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise ConfigError("nproc (processes per node) must be >= 1")
        if not self.job_id:
            raise ConfigError("an agent needs the job id (every host names the same job)")
        if not Path(self.script).is_file():
            raise ConfigError(f"script {self.script!r} does not exist")
        if self.connect_timeout_s <= 0 or self.coordinator_timeout_s <= 0:
            raise ConfigError("agent timeouts must be > 0")


class Agent:
    """Runs one host's processes for the coordinator (see the module docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        import sys

        self.cfg = config
        self.ident = config.identity
        self.rank = config.identity.node_rank
        config.log_dir.mkdir(parents=True, exist_ok=True)
        self.pool = WorkerPool(python=config.python or sys.executable, script=config.script,
                               args=config.args, log_dir=config.log_dir)
        self.reported_exit: set[str] = set()
        self.reported_exiting: set[str] = set()
        self.gpu_of: dict[str, int] = {}
        self.ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.stop = threading.Event()
        self.store: Any = None
        # Serves a ``lend`` request (runtime.loanagent.serve_loan, set by runtime.nodes
        # for a job in a host pool); returns True when this agent should stop. None: the
        # host is never lent.
        self.on_lend: Callable[[Agent, dict[str, Any]], bool] | None = None
        # The coordinator watchdog: when the coordinator's beat counter last advanced
        # (this host's monotonic clock) and its last value. exit_process: the agent owns
        # its process (a host other than the coordinator's), so a lost coordinator ends
        # the process at once (os._exit) whatever the main thread is blocked in; False
        # for the coordinator's own agent (a thread of the supervisor's process) and a
        # borrowed host's second agent (runtime.loanagent), which return instead.
        self.exit_process = False
        self.coordinator_lost = False
        self._coord_seen = time.monotonic()
        self._coord_beat = -1
        self._exit: Callable[[int], None] = os._exit

    def _connect(self) -> Any:
        deadline = time.monotonic() + self.cfg.connect_timeout_s
        while True:
            try:
                return dist.TCPStore(self.ident.rdzv_host, self.ident.rdzv_port,
                                     is_master=False,
                                     timeout=timedelta(seconds=self.cfg.coordinator_timeout_s))
            except (RuntimeError, dist.DistStoreError) as exc:  # not up yet
                if time.monotonic() > deadline:
                    raise ConfigError(f"cannot reach the coordinator at {self.ident.rdzv_host}:"
                                      f"{self.ident.rdzv_port}: {exc}") from exc
                time.sleep(0.2)

    def run(self) -> int:
        """Serve the coordinator until the job ends; return the agent's exit status.

        Raises :class:`ConfigError` when the rendezvous endpoint is not this job's
        coordinator (another job's store, or none within ``connect_timeout_s``)."""
        self.store = self._connect()
        self._check_job()
        # The heartbeat's own connection exists before this node registers: the
        # coordinator counts silence from its first look at a registered node, so a
        # connection still being made then (TCPStore retries a failed attempt after a
        # 1-2 s back-off) would already count as silence.
        beat_store = self._connect()
        self.store.set(P.node_beat_key(self.rank), "0")
        self.store.set(P.node_info_key(self.rank), json.dumps({
            "name": self.ident.node_name, "pid": os.getpid(), "pgid": os.getpgid(0),
            "machine": machine_id(), "nproc": self.cfg.nproc, "host": socket.gethostname()}))
        log.info("node %d (%s) joined the job at %s:%d with %d place(s)", self.rank,
                 self.ident.node_name, self.ident.rdzv_host, self.ident.rdzv_port,
                 self.cfg.nproc)
        # Beats come from a thread of their own: the heartbeat says the host is alive,
        # and the loop's own work (starting the zygote, forking processes: hundreds of
        # ms under load) must not look like a frozen host. A stopped or dead host stops
        # the thread too.
        self._coord_seen = time.monotonic()
        threading.Thread(target=self._beat, args=(beat_store,), name="yoco-beat",
                         daemon=True).start()
        threading.Thread(target=self._watchdog, name="yoco-coordinator-watchdog",
                         daemon=True).start()
        if self.cfg.fork_spares:
            self.pool.start_zygote(dict(os.environ))
        last_shutdown = 0.0
        failing_since: float | None = None
        try:
            while not self.stop.is_set():
                if self.coordinator_lost:
                    return EXIT_COORDINATOR_LOST
                now = time.monotonic()
                try:
                    self._serve_requests()
                    self._report()
                    if now - last_shutdown >= 0.05:
                        last_shutdown = now
                        if self.store.check([P.KEY_SHUTDOWN]):
                            break
                        if self.store.check([P.node_fenced_key(self.rank)]):
                            return self._fenced()
                    failing_since = None
                except (RuntimeError, dist.DistStoreError) as exc:
                    failing_since = failing_since or now
                    if now - failing_since > self.cfg.coordinator_timeout_s:
                        self._lose_coordinator(f"its store failing for "
                                               f"{now - failing_since:.1f} s: {exc}")
                        return EXIT_COORDINATOR_LOST
                time.sleep(0.005)
        finally:
            self.stop.set()
            self.pool.shutdown()
        if self.coordinator_lost:
            return EXIT_COORDINATOR_LOST
        with_errors = [s for s, p in self.pool.procs.items() if p.poll() not in (0, None)]
        if with_errors:
            log.info("node %s: processes that did not exit 0: %s", self.ident.node_name,
                     ", ".join(with_errors))
        return 0

    def _check_job(self) -> None:
        # Whose store is this? A port taken by another job's coordinator (two jobs, one
        # endpoint; a port reused on a shared machine) must not get this host's processes.
        where = f"{self.ident.rdzv_host}:{self.ident.rdzv_port}"
        deadline = time.monotonic() + self.cfg.connect_timeout_s
        while not self.store.check([P.KEY_JOB]):
            if time.monotonic() > deadline:
                raise ConfigError(f"the store at {where} is not a yoco coordinator's (no job "
                                  f"id within {self.cfg.connect_timeout_s:.0f} s)")
            time.sleep(0.05)
        found = self.store.get(P.KEY_JOB).decode()
        if found != self.cfg.job_id:
            raise ConfigError(f"the coordinator at {where} runs job {found!r}, not "
                              f"{self.cfg.job_id!r}: this host does not join it")

    def _beat(self, store: Any) -> None:
        # On a connection of its own (a TCPStore client runs one request at a time), the
        # first beat at once, then every NODE_BEAT_INTERVAL_S; each beat also reads the
        # coordinator's counter, for the watchdog. A failing store is retried (the
        # watchdog, not this thread, decides when the coordinator is lost).
        failed = False
        while not self.stop.is_set():
            try:
                store.add(P.node_beat_key(self.rank), 1)
                beat = int(store.add(P.KEY_COORD_BEAT, 0))
                if beat != self._coord_beat:
                    self._coord_beat, self._coord_seen = beat, time.monotonic()
                failed = False
            except (RuntimeError, dist.DistStoreError) as exc:
                if not failed:
                    log.warning("node %s: heartbeat failing: %s", self.ident.node_name, exc)
                failed = True
            if self.stop.wait(P.NODE_BEAT_INTERVAL_S):
                return

    def _watchdog(self) -> None:
        while not self.stop.wait(WATCHDOG_INTERVAL_S):
            now = time.monotonic()
            if coordinator_lost(self._coord_seen, now, self.cfg.coordinator_timeout_s):
                self._lose_coordinator(f"no coordinator heartbeat for "
                                       f"{now - self._coord_seen:.1f} s (deadline "
                                       f"{self.cfg.coordinator_timeout_s:.1f} s)")
                return

    def _lose_coordinator(self, why: str) -> None:
        """Stop this host's processes (training unrecorded is not allowed) and, in an
        agent's own process, exit :data:`EXIT_COORDINATOR_LOST` at once."""
        if self.coordinator_lost:
            return
        self.coordinator_lost = True
        log.error("node %s: the coordinator is lost (%s): stopping this node's processes; "
                  "`yoco run --resume` on every host continues the job",
                  self.ident.node_name, why)
        self._kill_all()
        self.stop.set()
        if self.exit_process:
            logging.shutdown()  # flush the log line above
            self._exit(EXIT_COORDINATOR_LOST)

    def _fenced(self) -> int:
        """The coordinator fenced this host (it was silent: frozen, cut off) and moved
        its ranks elsewhere: kill its processes (nothing of them may run on) and return
        :data:`runtime.protocol.EXIT_FENCED`, saying so."""
        fence = json.loads(self.store.get(P.node_fenced_key(self.rank)))
        msg = (f"node {self.ident.node_name} was fenced by the coordinator "
               f"({fence.get('cause')}: {fence.get('detail')}); its ranks run elsewhere: "
               f"stopping this node's processes, exit {P.EXIT_FENCED}")
        log.error("%s", msg)
        self._kill_all()
        return P.EXIT_FENCED

    def _kill_all(self) -> None:
        # Signals only (no store call, no wait): the watchdog must not block. The zygote
        # goes too (it would fork nothing more, but it holds memory).
        for p in list(self.pool.procs.values()):
            if p.poll() is None:
                p.kill()
        if self.pool.zygote is not None:
            self.pool.zygote.kill()

    def _serve_requests(self) -> None:
        # Popped until empty, never counted first: torch's ``queue_len`` keeps the GIL while
        # it waits for the store's answer, so through a partition (an answer that never
        # comes: the call was seen blocked for 45 s) it froze every thread of the agent,
        # the coordinator watchdog included (gdb: the watchdog in take_gil, the main thread
        # in TCPStore::queueLen). ``queue_pop`` releases the GIL while it waits.
        key = P.node_requests_key(self.rank)
        while True:
            try:
                raw = self.store.queue_pop(key, False)
            except dist.QueueEmptyError:
                return
            req = json.loads(raw)
            slot = str(req["slot"])
            if req["op"] == "spawn":
                self._spawn(slot, dict(req.get("env", {})))
            elif req["op"] == "kill" and slot in self.pool.procs:
                self.pool.kill(slot)
            elif req["op"] == "lend" and self.on_lend is not None \
                    and self.on_lend(self, req):
                self.stop.set()  # the home job ended while this host was lent

    def _spawn(self, slot: str, delta: dict[str, str]) -> None:
        env = {**os.environ, **delta, P.ENV_NODE: self.ident.node_name}
        if self.ngpu:
            busy = {self.gpu_of[s] for s, p in self.pool.procs.items()
                    if s in self.gpu_of and p.poll() is None}
            self.gpu_of[slot] = min(set(range(self.ngpu)) - busy, default=0)
            env[P.ENV_DEVICE] = f"cuda:{self.gpu_of[slot]}"
        else:
            env[P.ENV_DEVICE] = "cpu"
        self.pool.spawn(slot, env)
        self._event({"kind": "started", "slot": slot, "pid": self.pool.procs[slot].pid})

    def _report(self) -> None:
        for slot, p in self.pool.procs.items():
            if slot in self.reported_exit:
                continue
            rc = p.poll()
            if rc is not None:
                self.reported_exit.add(slot)
                self._event({"kind": "exit", "slot": slot, "rc": rc})
            elif slot not in self.reported_exiting and process_exiting(p.pid):
                self.reported_exiting.add(slot)
                self._event({"kind": "exiting", "slot": slot})

    def _event(self, ev: dict[str, Any]) -> None:
        ev["node"] = self.ident.node_name
        self.store.queue_push(P.KEY_AGENT_EVENTS, json.dumps(ev))
