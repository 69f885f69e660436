"""Fencing by generation: a host fenced as hung that comes back changes nothing.

Real hosts (tests/runtime/netns.py: network namespaces, each its own machine id, so the
coordinator can neither read their /proc nor kill them, as with a second machine), real
signals, the real ``yoco run --nnodes`` on every host. A worker host is frozen (SIGSTOP of
everything on it) or cut off (its switch port down) until the coordinator fences it as
``hang`` and moves its rank onto the spare host, then thawed or healed: the job must end
bit-identical to a failure-free run, with one failure and one outcome, and the fenced host
must learn it was fenced and exit non-zero with its line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.state import split_state
from tests.runtime.conftest import Reference
from tests.runtime.netns import Netns, NetnsCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "mlp_train.py")
STEPS = 16


def _assert_identical(a: Path, b: Path) -> None:
    sa, sb = torch.load(a), torch.load(b)
    assert sa["step"] == sb["step"] == STEPS
    ta = split_state({"m": sa["model"], "o": sa["optimizer"]})[1]
    tb = split_state({"m": sb["model"], "o": sb["optimizer"]})[1]
    assert len(ta) == len(tb)
    diff = max(float((x.double() - y.double()).abs().max()) for x, y in zip(ta, tb, strict=True))
    assert diff == 0.0, f"final state differs from the failure-free run: max |d| {diff:.3g}"


def _cluster(net: Netns, tmp: Path) -> NetnsCluster:
    return NetnsCluster(net, tmp, script=EXAMPLE,
                        script_args=["--steps", str(STEPS), "--step-sleep", "0.15",
                                     "--out", str(tmp / "final.pt")],
                        nnodes="2:+1", nproc=1,
                        extra=["--checkpoint-every", "5", "--progress-every", "0.2",
                               "--node-timeout", "2"])


def _failures(c: NetnsCluster) -> list[dict[str, Any]]:
    return [r for r in c.outbox() if r["kind"] == "failure"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["freeze", "cut"])
def test_a_fenced_worker_host_that_comes_back_changes_nothing(
        fault: str, failure_free: Reference, netns: Callable[[int], Netns],
        tmp_path: Path) -> None:
    ref = failure_free(EXAMPLE, ["--steps", str(STEPS)], workers=2)
    net = netns(3)
    c = _cluster(net, tmp_path)
    c.start_all()
    c.progress_at(5)
    if fault == "freeze":
        net.freeze(1)
    else:
        net.cut(1)
    # Fenced as hung (silent past --node-timeout) and its rank moved onto host2 ...
    c.wait_until(lambda: any(r["kind"] == "outcome" for r in c.outbox()), "the outcome")
    # ... then the host comes back while the job still trains.
    if fault == "freeze":
        net.thaw(1)
    else:
        net.heal(1)
    assert c.wait(0) == 0, c.logs()
    recs = c.records()
    fails = [r for r in recs if r["kind"] == "failure"]
    outcomes = [r for r in recs if r["kind"] == "outcome"]
    assert [(f["node"], f["cause"]) for f in fails] == [("host1", "hang")], c.logs()
    assert [(o["failure_event_id"], o["outcome"], o["lost_steps"]) for o in outcomes] \
        == [(fails[0]["event_id"], "live_migrated", 0)]
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    _assert_identical(ref, tmp_path / "final.pt")
    assert c.wait(2) == 0, c.logs()  # the spare host served and ended normally
    rc = c.wait(1, timeout=60)
    assert rc == 5, c.logs()
