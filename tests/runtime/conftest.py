"""Fixtures of the runtime tests: failure-free reference runs, shared by the session."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.netns import Netns

#: run(script, args, workers=2, env=None) -> where rank 0's final state is (see failure_free).
Reference = Callable[..., Path]


@pytest.fixture(scope="session")
def failure_free(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """``run(script, args, workers=2, env=None)``: the path of rank 0's final state (with
    ``--out-all-ranks`` in ``args``, rank r's is ``PATH.rankR``) after a failure-free run
    of ``script args`` under the runtime, ``workers`` wide (``env``: variables added to
    the workers' environment), checked to have recorded no
    failure and to have finished its ``--steps``.

    Tests compare the state a run with failures ends with to this one, bit for bit. The
    same script, arguments and width train the same state, so each such run is made once
    per session and shared. It runs without spares (it has nothing to replace) and without
    ``--step-sleep`` (a pause between steps, which only gives the tests with faults time
    to act, changes nothing in the state)."""
    root = tmp_path_factory.mktemp("failure-free")
    made: dict[tuple[Any, ...], Path] = {}

    def run(script: str, args: Sequence[str], workers: int = 2,
            env: Mapping[str, str] | None = None) -> Path:
        args = list(args)
        assert "--out" not in args, "the reference's --out is its own"
        if "--step-sleep" in args:
            at = args.index("--step-sleep")
            del args[at:at + 2]
        key = (script, tuple(args), workers, tuple(sorted((env or {}).items())))
        if key not in made:
            name = f"ref{len(made)}"
            out = root / f"{name}.pt"
            sink = JsonlFileSink(root / f"{name}.jsonl")
            cfg = LaunchConfig(script=script, args=[*args, "--out", str(out)],
                               workers=workers, spares=0, job_id=name,
                               contract_id="c-test", runs_root=str(root / "runs"),
                               nvml=False, env=dict(env or {}))
            result = launch(cfg, sink)
            assert result.exit_code == 0, result
            recs = sink.read_all()
            kinds = [r["kind"] for r in recs]
            assert kinds[0] == "job_started" and kinds[-1] == "job_finished", kinds
            assert "failure" not in kinds, recs
            steps = int(args[args.index("--steps") + 1])
            assert recs[-1]["step"] == steps, recs[-1]
            made[key] = out
        return made[key]

    return run


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[Callable[[int], Netns]]:
    """``make(hosts)``: a :class:`tests.runtime.netns.Netns` of ``hosts`` hosts, each in a
    network namespace of its own with its own machine id, on a private switch (freeze,
    thaw, cut, heal; :class:`tests.runtime.netns.NetnsCluster` runs ``yoco run`` on them).
    Every process on them is killed and the namespaces deleted at the end of the test,
    whatever its outcome (and any a crashed run left are deleted when the next one is
    made)."""
    made: list[Netns] = []

    def make(hosts: int) -> Netns:
        net = Netns(hosts, tmp_path / f"netns{len(made)}")
        made.append(net)
        return net

    yield make
    for net in made:
        net.close()


@pytest.fixture
def remote_pair_store() -> Any:
    """A real ``TCPStore`` (this process its server) on which two node agents have
    registered and beaten once: node 0 on this machine (this process), node 1 on
    "another machine" (nothing of it in this machine's ``/proc``), for in-process tests
    of the coordinator's :class:`runtime.nodepool.NodePool`."""
    import json
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from runtime import protocol as P
    from runtime.nodepool import machine_id

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    here = {"name": "host0", "pid": os.getpid(), "pgid": os.getpgid(0),
            "machine": machine_id(), "nproc": 1}
    there = {"name": "host1", "pid": 1, "pgid": 1, "machine": "another-machine", "nproc": 1}
    for rank, info in enumerate((here, there)):
        store.set(P.node_beat_key(rank), "0")
        store.set(P.node_info_key(rank), json.dumps(info))
    return store
