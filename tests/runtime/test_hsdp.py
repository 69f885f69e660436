"""HSDP under the runtime: the GPT example sharded with FSDP2 (``fully_shard``)
inside replica groups of two, two replica groups (2 x 2) plus a spare, real processes on
gloo/CPU, real SIGKILLs. A lost rank's shard is rebuilt from the rank holding the same
shard in the other replica group, a lost replica group from the other one, a shard lost
in both groups from the sharded (``torch.distributed.checkpoint``) checkpoint; every
rank's final shards (parameters and AdamW state) are compared with ``torch.equal``
against a failure-free run of the same layout, and the checkpoint itself, loaded
unsharded, against the gathered shards. The live incidents share one job (each fault
fires once, after the previous recovery): the final state of a job that went through
all of them is still bit-identical to the failure-free run's, and each is recorded as
one failure with its own outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime import protocol as P
from runtime.errors import CheckpointError
from runtime.faults import parse_fault
from runtime.sharded_checkpoint import latest_sharded_checkpoint, read_sharded_checkpoint
from runtime.sink import JsonlFileSink
from runtime.state import split_state
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.test_llm_loop import GPT, TINY, _one_outcome_each
from tests.runtime.test_migration import ROOT, _failures

pytestmark = pytest.mark.slow

STEPS = 12
WORKERS, SHARDS = 4, 2


def _run(tmp: Path, name: str, *, faults: list[str], spares: int, sleep: float = 0.1,
         ckpt: int = 0, env: dict[str, str] | None = None,
         ) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=GPT, args=["--steps", str(STEPS), "--out", str(out),
                                         "--out-all-ranks", "--step-sleep", str(sleep),
                                         *TINY, "--fsdp"],
                       workers=WORKERS, shards=SHARDS, spares=spares, job_id=name,
                       contract_id="c-test", runs_root=str(tmp / "runs"),
                       faults=[parse_fault(f) for f in faults], nvml=False,
                       progress_interval_s=0.5, checkpoint_every=ckpt, env=env or {})
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
    # With sharded checkpoints every 3 steps (they change nothing in the training), so
    # that the last one can be checked against the final shards.
    tmp = tmp_path_factory.mktemp("hsdp-ref")
    result, recs, out = _run(tmp, "ref", faults=[], spares=0, ckpt=3)
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


def _tiny_gpt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The test's GPT and AdamW in this process, unsharded (as the example builds them)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt_train  # type: ignore[import-not-found]

    ap = gpt_train.argparse.ArgumentParser()
    gpt_train.add_model_args(ap)
    args, _ = ap.parse_known_args(list(TINY))
    _, vocab = gpt_train.make_data(args)
    model = gpt_train.build_model(args, vocab)
    return model, gpt_train.make_optimizer(model, args)


def _gathered(out: Path, shards: int) -> dict[str, Any]:
    """Replica group 0's final state with every shard gathered (FSDP2 shards dim 0)."""
    parts = [torch.load(_rank_file(out, k)) for k in range(shards)]
    full_model = {k: torch.cat([p["model"][k] for p in parts]) for k in parts[0]["model"]}
    full_opt = {i: {n: torch.cat([p["optimizer"]["state"][i][n] for p in parts])
                    if v.dim() else v for n, v in e.items()}
                for i, e in parts[0]["optimizer"]["state"].items()}
    return {"model": full_model, "optimizer": full_opt, "step": parts[0]["step"]}


def test_the_sharded_checkpoint_is_dcp_and_loads_unsharded_as_the_gathered_shards(
        reference: Path) -> None:
    # The last checkpoint of the failure-free run (step 12, written by the two ranks of
    # replica group 0 apart, merged into one DCP checkpoint) read into one unsharded
    # process (DCP reshards): every tensor equals the final shards gathered.
    ckpts = reference.parent / "runs" / "ref" / "checkpoints"
    found = latest_sharded_checkpoint(ckpts)
    assert found is not None and found[0] == STEPS, found
    model, opt = _tiny_gpt()
    state = read_sharded_checkpoint(found[1], model, opt)
    want = _gathered(reference, SHARDS)
    assert state["step"] == want["step"] == STEPS
    assert state["model"].keys() == want["model"].keys()
    for k, v in want["model"].items():
        assert torch.equal(state["model"][k], v), k
    assert state["optimizer"]["state"].keys() == want["optimizer"].keys()
    for i, entry in want["optimizer"].items():
        assert list(state["optimizer"]["state"][i]) == list(entry)  # same order
        for n, v in entry.items():
            assert torch.equal(state["optimizer"]["state"][i][n], v), (i, n)
    assert state["sampler"]["position"] > 0 and state["scheduler"]["last_epoch"] == STEPS
    # The older whole checkpoint is kept too, nothing else (no temporary folder left).
    assert sorted(p.name for p in ckpts.iterdir()) == ["dcp-step-000000009",
                                                       "dcp-step-000000012"]


# The live incidents, one job: each fault fires once and at least one whole step after
# the previous recovery's first committed step (a death inside a recovery joins its
# incident), so each is an incident of its own; spares are replenished from the zygote
# between them, or forked at once when none is ready.
LIVE = [
    # One lost rank: killed inside FSDP2's backward (its replica-group peer's collectives
    # fail mid-backward), in the runtime's cross-group reduction, and right after its own
    # optimizer step (the update applied, the step not yet counted). Its replica-group
    # peer keeps its shard and its process; a spare built for the shard takes its place.
    ("kill:rank=1:step=1:phase=backward",),
    ("kill:rank=2:step=3:phase=reduce",),
    ("kill:rank=1:step=6:phase=optimizer",),
    # A whole replica group (rank 0 among them) in the same step: the other group holds
    # both shards; two spares (one ready, one forked from the zygote) take its places.
    ("kill:rank=0:step=9:phase=forward", "kill:rank=1:step=9:phase=forward"),
    # One rank in each replica group at once (different shards): each shard is still held
    # in the other group.
    ("kill:rank=0:step=11:phase=forward", "kill:rank=3:step=11:phase=forward"),
]


def _events(timeline: Path, slot: str) -> list[dict[str, Any]]:
    path = timeline / f"{slot}.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _by_incident(fails: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first failure recorded for each incident of :data:`LIVE`, checking that each
    names exactly the incident's dead. The ranks of one incident die in the same step,
    each at its own fault point: one failure when their deaths fall in one merge window,
    or, when a loaded machine holds one back until the recovery from the first has begun,
    a failure of its own recorded during that recovery (both true records)."""
    firsts = []
    it = iter(fails)
    for incident in LIVE:
        first = next(it, None)
        assert first is not None, f"no failure recorded for {incident}: {fails}"
        firsts.append(first)
        dead, prev = first["detail"].count("exit -9"), first
        while dead < len(incident):
            more = next(it, None)
            assert more is not None, f"{incident}: only {dead} death(s) recorded: {fails}"
            assert f"during the recovery from failure {prev['event_id']}" in more["detail"], \
                fails
            dead, prev = dead + more["detail"].count("exit -9"), more
        assert dead == len(incident), (incident, fails)
    assert next(it, None) is None, f"more failures than the incidents: {fails}"
    return firsts


def test_lost_ranks_are_rebuilt_live_from_their_shard_twins(reference: Path,
                                                            tmp_path: Path) -> None:
    timeline = tmp_path / "timeline"
    timeline.mkdir()
    result, recs, out = _run(tmp_path, "live", spares=1,
                             faults=[f for incident in LIVE for f in incident],
                             env={P.ENV_TIMELINE: str(timeline)})
    assert result.exit_code == 0, result
    # Every death live with nothing lost, each named once.
    fails = [r for r in recs if r["kind"] == "failure"]
    assert set(_failures(recs)) == {("unplanned", "process_killed", "live_migrated", 0)}, fails
    _one_outcome_each(recs)
    fails = _by_incident(fails)
    # The step each failure is recorded at: the last step its generation's rank 0
    # reported. After a kill right after its own optimizer step, or of ranks in different
    # replica groups at the start of a step, a replica group may have committed that step
    # or not yet (survivors one step apart: the commit vote brings them together); after a
    # kill with its cross-group allreduce launched (step 3), its twin -- rank 0 -- may
    # have completed that allreduce and committed the step (4) or not (3), as in
    # test_migration's rollback (the record waits for the merge window, so it sees rank
    # 0's report of step 4 when there is one).
    steps = [f["step"] for f in fails]
    assert steps[0] == 1 and steps[1] in (3, 4) and steps[2] in (6, 7) \
        and steps[3] in (8, 9) and steps[4] in (10, 11), fails
    _assert_every_shard_identical(reference, out)
    # How the first incident went (the workers' timelines): rank 0, whose shard-group
    # peer died in the backward pass, had its backward cut short at the next collective
    # instead of computing the rest of it; the spare called in had run its warm-up pass
    # before it was called in.
    cut = [e for e in _events(timeline, "w0") if e["ev"] == "backward_cut"]
    assert cut and cut[0]["step"] == 1 and cut[0]["gen"] == 0, cut
    spare = _events(timeline, "w4")
    assert [e["ev"] for e in spare][:3] == ["join", "warmed_up", "groups"], spare[:4]


def test_a_shard_lost_in_every_replica_group_rolls_back_to_the_sharded_checkpoint(
        reference: Path, tmp_path: Path) -> None:
    # Sharded checkpoints every 3 steps, written by the ranks of replica group 0; three
    # incidents in one job:
    # * rank 2 dies (live: a spare takes its place; it then takes part in the rollback);
    # * both holders of shard 1 die in step 8 (in its backward pass, so that rank 0 has
    #   committed step 7 before either can die: both replica groups are in step 8), in
    #   one incident: no replica holds shard 1, so everyone (survivors and the spares
    #   that replace the dead) reloads its shards of the newest whole DCP checkpoint
    #   (step 6), and the steps since are lost;
    # * in the rerun, rank 1 (shard 1 of replica group 0, a checkpoint writer) is killed
    #   half-way through its part of the checkpoint of step 9: data written, its metadata
    #   not. Its twin holds the shard: live. The torn folder never becomes a checkpoint.
    result, recs, out = _run(tmp_path, "lost", spares=1, ckpt=3,
                             faults=["kill:rank=2:step=2:phase=reduce",
                                     "kill:rank=1:step=8:phase=backward",
                                     "kill:rank=3:step=8:phase=backward",
                                     "kill:rank=1:step=9:phase=checkpoint"])
    assert result.exit_code == 0, result
    [_, fail, _] = [r for r in recs if r["kind"] == "failure"]
    assert "w1 exit -9" in fail["detail"] and "w3 exit -9" in fail["detail"], fail
    assert fail["step"] == 8, fail
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0),
                               ("unplanned", "process_killed", "rolled_back", 8 - 6),
                               ("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(recs)
    _assert_every_shard_identical(reference, out)
    # The checkpoints: whole DCP folders of steps 6 and 12 (the rerun's 9 is the torn
    # one); the only temporary folder left is the torn one, which holds shard 1's data
    # without its metadata and does not load.
    ckpts = tmp_path / "runs" / "lost" / "checkpoints"
    assert latest_sharded_checkpoint(ckpts)[0] == STEPS  # type: ignore[index]
    names = sorted(p.name for p in ckpts.iterdir())
    assert [n for n in names if not n.startswith(".")] == ["dcp-step-000000006",
                                                           "dcp-step-000000012"], names
    [torn] = [p for p in ckpts.iterdir() if p.name.startswith(".")]
    assert torn.name.startswith(".dcp-step-000000009."), names
    assert (torn / "__1_0.distcp").exists() and not (torn / "__1.metadata").exists()
    assert not (torn / ".metadata").exists()
    with pytest.raises(CheckpointError, match="no readable global metadata"):
        read_sharded_checkpoint(torn, *_tiny_gpt())


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
