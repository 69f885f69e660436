"""HSDP under the runtime (issue 14): the GPT example sharded with FSDP2 (``fully_shard``)
inside replica groups of two, two replica groups (2 x 2) plus a spare, real processes on
gloo/CPU, real SIGKILLs. A lost rank's shard is rebuilt from the rank holding the same
shard in the other replica group; every rank's final shards (parameters and AdamW state)
are compared with ``torch.equal`` against a failure-free run of the same layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.state import split_state
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.test_llm_loop import GPT, TINY
from tests.runtime.test_migration import ROOT, _failures

pytestmark = pytest.mark.slow

STEPS = 12
WORKERS, SHARDS = 4, 2


def _run(tmp: Path, name: str, *, faults: list[str], spares: int, sleep: float = 0.1,
         ckpt: int = 0) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=GPT, args=["--steps", str(STEPS), "--out", str(out),
                                         "--out-all-ranks", "--step-sleep", str(sleep),
                                         *TINY, "--fsdp"],
                       workers=WORKERS, shards=SHARDS, spares=spares, job_id=name,
                       contract_id="c-test", runs_root=str(tmp / "runs"),
                       faults=[parse_fault(f) for f in faults], nvml=False,
                       progress_interval_s=0.5, checkpoint_every=ckpt)
    result = launch(cfg, sink)
    return result, sink.read_all(), out


def _rank_file(out: Path, rank: int) -> Path:
    return out if rank == 0 else Path(f"{out}.rank{rank}")


def _shards(path: Path) -> tuple[int, list[torch.Tensor]]:
    state = torch.load(path)
    return state["step"], split_state({"m": state["model"], "o": state["optimizer"]})[1]


def _assert_every_shard_identical(a: Path, b: Path) -> None:
    for rank in range(WORKERS):
        step_a, ta = _shards(_rank_file(a, rank))
        step_b, tb = _shards(_rank_file(b, rank))
        assert step_a == step_b == STEPS
        assert len(ta) == len(tb) > 0
        for x, y in zip(ta, tb, strict=True):
            assert torch.equal(x, y), f"rank {rank} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hsdp-ref")
    result, recs, out = _run(tmp, "ref", faults=[], spares=0)
    assert result.exit_code == 0, result
    assert "failure" not in [r["kind"] for r in recs]
    # Ranks holding the same shard in the two replica groups agree; the shards differ.
    for rank in range(SHARDS):
        _, mine = _shards(_rank_file(out, rank))
        _, twin = _shards(_rank_file(out, rank + SHARDS))
        assert all(torch.equal(x, y) for x, y in zip(mine, twin, strict=True))
    _, s0 = _shards(_rank_file(out, 0))
    _, s1 = _shards(_rank_file(out, 1))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(s0, s1, strict=True))
    return out


def test_fsdp_example_runs_alone(tmp_path: Path) -> None:
    """``python examples/gpt_train.py --fsdp``: FSDP2 over a shard mesh of one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("YOCO_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, GPT, "--steps", "4", "--fsdp", *TINY],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("fault", ["kill:rank=1:step=5:phase=backward",
                                   "kill:rank=2:step=4:phase=reduce"])
def test_one_lost_rank_is_rebuilt_from_its_shard_twin(reference: Path, tmp_path: Path,
                                                      fault: str) -> None:
    # Killed inside FSDP2's collectives (backward, forward) or the runtime's cross-group
    # reduction: its replica-group peer keeps its shard and its process.
    result, recs, out = _run(tmp_path, "one", faults=[fault], spares=1)
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    fail = next(r for r in recs if r["kind"] == "failure")
    assert fail["detail"].count("exit") == 1, fail  # only the killed rank died
    _assert_every_shard_identical(reference, out)


def test_one_rank_in_each_replica_group_at_once_is_live(reference: Path,
                                                        tmp_path: Path) -> None:
    # Replica group 0 loses shard 0, replica group 1 loses shard 1, in the same step: each
    # shard is still held in the other group.
    result, recs, out = _run(tmp_path, "each", spares=1,
                             faults=["kill:rank=0:step=5:phase=forward",
                                     "kill:rank=3:step=5:phase=forward"])
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert "w0 exit -9" in fail["detail"] and "w3 exit -9" in fail["detail"], fail
    _assert_every_shard_identical(reference, out)


def test_a_shard_lost_in_every_replica_group_rolls_back_to_the_sharded_checkpoint(
        reference: Path, tmp_path: Path) -> None:
    # Both holders of shard 1 die at once: no replica holds it. Every rank of replica
    # group 0 writes its shard of a checkpoint every 3 steps; everyone reloads the newest
    # checkpoint of which every shard is complete (step 6), and the steps since are lost.
    result, recs, out = _run(tmp_path, "lost", spares=1, ckpt=3,
                             faults=["kill:rank=1:step=8:phase=forward",
                                     "kill:rank=3:step=8:phase=forward"])
    assert result.exit_code == 0, result
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert "w1 exit -9" in fail["detail"] and "w3 exit -9" in fail["detail"], fail
    assert fail["step"] == 8, fail
    assert _failures(recs) == [("unplanned", "process_killed", "rolled_back", 8 - 6)]
    # Each shard's writer kept its own newest files (both shards, the rerun's too).
    ckpts = sorted(p.name for p in (tmp_path / "runs" / "lost" / "checkpoints").glob("hsdp*"))
    assert ckpts == [f"hsdp2-step-{s:09d}-shard-{k}.pt" for s in (9, 12) for k in (0, 1)]
    _assert_every_shard_identical(reference, out)


def test_a_shard_lost_everywhere_without_checkpoint_fails_truthfully(tmp_path: Path) -> None:
    # Without checkpoints nothing holds shard 1 any more: outcome failed, the job's end
    # recorded, exit 1.
    result, recs, _ = _run(tmp_path, "gone", spares=1,
                           faults=["kill:rank=1:step=4:phase=forward",
                                   "kill:rank=3:step=4:phase=forward"])
    assert result.exit_code == 1
    got = _failures(recs)
    assert len(got) == 1 and got[0][:3] == ("unplanned", "process_killed", "failed"), got
    assert recs[-1]["kind"] == "job_finished"
