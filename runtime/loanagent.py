"""The node agent's side of spare borrowing (:mod:`runtime.borrowing`): serving a
``lend`` request of its coordinator by joining the borrower's job for a while.

Kept apart from :mod:`runtime.agent` (which knows nothing of the pool): the agent calls
its ``on_lend`` hook, which :mod:`runtime.nodes` sets to :func:`serve_loan`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from runtime import protocol as P
from runtime.agent import Agent, AgentConfig
from runtime.borrowing import HostRecord, PoolClient, parse_endpoint
from runtime.errors import ConfigError

log = logging.getLogger("yoco.runtime.loanagent")


class _SharedZygote:
    """The home agent's spare zygote lent to the borrowed session (it must outlive it)."""

    def __init__(self, zygote: Any) -> None:
        self._z = zygote

    def __getattr__(self, name: str) -> Any:
        return getattr(self._z, name)

    def close(self) -> None:
        """Not closed with the borrowed session: the home agent keeps it."""


def serve_loan(agent: Agent, req: dict[str, Any]) -> bool:
    """Lend ``agent``'s host as its coordinator asked (``req``: {op: lend, pool}): end
    every process of the home job here, mark the host ``lent``, serve the borrower as its
    node agent until the borrower's job ends or its coordinator is lost, end its
    processes, mark the host ``home`` and tell the home coordinator. Returns True when
    the home job has ended meanwhile (the agent then has nothing left to do)."""
    name = agent.ident.node_name
    for p in agent.pool.procs.values():
        if p.poll() is None:
            p.kill()
    for p in agent.pool.procs.values():
        with contextlib.suppress(Exception):
            p.wait(timeout=30)
    agent._report()  # their exits, to the home coordinator
    endpoint = str(req["pool"])
    rec = _mark(endpoint, name, lambda r: dataclasses.replace(r, state="lent")
                if r.state == "lending" else None)
    if rec is None or rec.borrower is None:
        log.warning("node %s: the loan was withdrawn (or the pool does not answer): back "
                    "to its own job", name)
        agent._event({"kind": "returned", "slot": "", "pid": os.getpid()})
        return False
    b = rec.borrower
    host, port = parse_endpoint(str(b["endpoint"]))
    rank = int(b["rank"])
    log.warning("node %s: lent to job %s as its node %d (%s)", name, b["job"], rank,
                b["endpoint"])
    rc = None
    try:
        store = dist.TCPStore(host, port, is_master=False,
                              timeout=timedelta(seconds=agent.cfg.coordinator_timeout_s))
        spec = json.loads(store.get(P.node_job_key(rank)))
        ident = dataclasses.replace(agent.ident, node_rank=rank, nnodes=rank + 1,
                                    spare_nodes=0, rdzv_host=host, rdzv_port=port)
        borrowed = Agent(AgentConfig(
            identity=ident, job_id=str(spec["job"]), script=str(spec["script"]),
            args=list(spec["args"]),
            nproc=agent.cfg.nproc, log_dir=agent.cfg.log_dir / f"lent-to-{b['job']}",
            python=str(spec["python"]), fork_spares=False,
            coordinator_timeout_s=agent.cfg.coordinator_timeout_s))
        if agent.pool.zygote is not None:
            borrowed.pool.zygote = _SharedZygote(agent.pool.zygote)  # type: ignore[assignment]
        rc = borrowed.run()
    except (RuntimeError, dist.DistStoreError, ConfigError, OSError) as exc:
        log.error("node %s: serving job %s failed: %s", name, b["job"], exc)
    back = _mark(endpoint, name, lambda r: dataclasses.replace(r, state="home", borrower=None)
                 if r.state == "lent" else None)
    log.warning("node %s: back from job %s (its agent ended with %s)", name, b["job"], rc)
    if back is not None and back.home_ended:
        log.info("node %s: its own job has ended meanwhile", name)
        return True
    agent._event({"kind": "returned", "slot": "", "pid": os.getpid()})
    return False


def _mark(endpoint: str, name: str, change: Callable[[HostRecord], HostRecord | None]
          ) -> HostRecord | None:
    """Change host ``name``'s pool record (:meth:`PoolClient.update`); None when nothing
    changed or the pool does not answer (logged): the agent serves its own job anyway."""
    try:
        return PoolClient(endpoint).update(name, change)
    except (RuntimeError, dist.DistStoreError, ConfigError) as exc:
        log.error("node %s: the pool at %s does not answer: %s", name, endpoint, exc)
        return None
