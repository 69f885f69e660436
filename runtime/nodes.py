"""Running one host of a multi-node job: what ``yoco run --nnodes ...`` does on each host.

Every host runs its node agent (:mod:`runtime.agent`); node rank 0 also runs the
coordinator -- the supervisor (:mod:`runtime.supervisor`) with a
:class:`runtime.nodepool.NodePool` -- which owns the store (on the rendezvous endpoint),
membership, generations, plans and the outbox. The run folder ``RUNS_ROOT/JOB`` is the
coordinator's; each agent keeps its processes' logs in ``RUNS_ROOT/JOB/logs/NODE/``.
Rank 0's worker notes each committed step in ``RUNS_ROOT/JOB/committed`` on its own host:
for ``--resume`` after a coordinator loss the run folder must be on storage shared by the
hosts (as a checkpoint folder must be), see docs/deploy.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import socket
import threading
from pathlib import Path

from runtime.agent import Agent, AgentConfig
from runtime.control import default_runs_root
from runtime.errors import ConfigError
from runtime.identity import NodeIdentity
from runtime.loanagent import serve_loan
from runtime.sink import RecordSink
from runtime.supervisor import JobResult, LaunchConfig, launch

log = logging.getLogger("yoco.runtime.nodes")


def run_node(identity: NodeIdentity, config: LaunchConfig, *, nproc: int,
             sink: RecordSink | None = None) -> tuple[int, JobResult | None]:
    """Run this host's part of the job described by ``config`` (its script, contract,
    job id, checkpointing, faults...; ``workers``/``spares``/``host``/``port``/``nodes``
    are derived from ``identity`` and ``nproc``, processes per node).

    Returns the exit status and, on the coordinator's host, the job's result.
    """
    if not config.job_id:
        raise ConfigError("a multi-node job needs --job-id: every host must name the same "
                          "job (under Slurm it defaults to slurm-$SLURM_JOB_ID)")
    if config.shards > 1:
        raise ConfigError("HSDP (--shards) across hosts is not supported yet: run it on "
                          "one host, or plain data parallelism across hosts")
    run_dir = Path(config.runs_root or default_runs_root()) / config.job_id
    agent = Agent(AgentConfig(identity=identity, job_id=config.job_id, script=config.script,
                              args=config.args,
                              nproc=nproc, log_dir=run_dir / "logs" / identity.node_name,
                              python=config.python, fork_spares=config.fork_spares))
    if config.pool:
        agent.on_lend = serve_loan  # this host may be lent to a job of higher priority
    if not identity.is_coordinator:
        # This process is the host's agent: a lost coordinator ends it at once (exit 4),
        # whatever its main thread is blocked in (runtime.agent's watchdog).
        agent.exit_process = True
        return agent.run(), None
    box: dict[str, int] = {}
    thread = threading.Thread(target=lambda: box.__setitem__("rc", agent.run()),
                              name="yoco-agent", daemon=True)
    thread.start()
    cfg = dataclasses.replace(
        config, nodes=identity.total_nodes, host=identity.rdzv_host,
        port=identity.rdzv_port, node_name=identity.node_name,
        workers=identity.nnodes * nproc,
        spares=identity.spare_nodes * nproc)
    result = launch(cfg, sink)
    thread.join(timeout=30)
    return result.exit_code, result


def free_rendezvous_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now and outside the kernel's ephemeral range, for a
    coordinator started a few seconds later (tests and benchmarks running every host on
    one machine). A port from ``bind(0)`` is in that range, where any outgoing connection
    or ``bind(0)`` of another process (gloo opens hundreds) may take it before the
    coordinator binds it: the coordinator then cannot start and the agents wait for it."""
    low, high = 32768, 60999
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    below = range(10000, low) if low > 11000 else range(high + 1, 65536)
    for port in random.sample(below, min(len(below), 200)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise ConfigError("no free port outside the ephemeral range")
