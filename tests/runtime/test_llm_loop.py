"""The training loop LLM trainers write (issue 14), under the runtime with real processes:
a GPT with AdamW, warm-up + cosine, gradient accumulation, bf16 autocast and clipping of
the averaged gradient. A SIGKILL in each phase of a step ends bit-identical to a
failure-free run, with exactly one failure and one outcome carrying the true lost steps."""

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
from runtime.supervisor import LaunchConfig, launch
from tests.runtime.test_migration import ROOT, _assert_identical, _failures

pytestmark = pytest.mark.slow

GPT = str(ROOT / "examples" / "gpt_train.py")
STEPS = 14
# Tiny, but every feature on: 2 micro-batches per step, bf16 autocast, clipping at a
# norm the early steps exceed (so clipping really changes the update).
TINY = ("--seq", "16", "--dim", "32", "--layers", "2", "--heads", "2", "--micro-batch", "4",
        "--accum", "2", "--text-chars", "20000", "--warmup-steps", "3", "--clip", "0.5",
        "--bf16", "--log-every", "0")


def _run(tmp: Path, name: str, *, faults: list[str], spares: int, ckpt: int = 0,
         sleep: float = 0.0, extra: tuple[str, ...] = (), workers: int = 2,
         ) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=GPT, args=["--steps", str(STEPS), "--out", str(out),
                                         "--out-all-ranks", "--step-sleep", str(sleep),
                                         *TINY, *extra],
                       workers=workers, spares=spares, job_id=name, contract_id="c-test",
                       runs_root=str(tmp / "runs"), checkpoint_every=ckpt,
                       faults=[parse_fault(f) for f in faults], nvml=False,
                       progress_interval_s=0.5)
    result = launch(cfg, sink)
    return result, sink.read_all(), out


def _one_outcome_each(recs: list[dict[str, Any]]) -> None:
    fails = [r["event_id"] for r in recs if r["kind"] == "failure"]
    outs = [r["failure_event_id"] for r in recs if r["kind"] == "outcome"]
    assert sorted(fails) == sorted(outs), (fails, outs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gpt-ref")
    result, recs, out = _run(tmp, "ref", faults=[], spares=0)
    assert result.exit_code == 0, result
    assert "failure" not in [r["kind"] for r in recs]
    _assert_identical(out, Path(f"{out}.rank1"), steps=STEPS)  # the replicas agree
    return out


def test_standalone_equals_itself_and_learns(tmp_path: Path) -> None:
    """``python examples/gpt_train.py`` runs alone; its loss goes down."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("YOCO_STORE", None)
    proc = subprocess.run([sys.executable, GPT, "--steps", "30", "--log-every", "10",
                           "--out", str(tmp_path / "alone.pt"), *TINY[:-2]],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    losses = [float(ln.split()[3]) for ln in proc.stdout.splitlines()
              if ln.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0], proc.stdout
    assert torch.load(tmp_path / "alone.pt")["step"] == 30


# (fault, checkpoint every): the phase names where in the step the rank dies.
PHASES = {
    "forward-mid-accumulation": ("kill:rank=1:step=4:phase=forward:micro=1", 0),
    "backward": ("kill:rank=0:step=5:phase=backward:micro=0", 0),
    "reduce": ("kill:rank=1:step=6:phase=reduce", 0),
    "optimizer": ("kill:rank=1:step=4:phase=optimizer", 0),
    "checkpoint-write": ("kill:rank=0:step=6:phase=checkpoint", 3),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_kill_in_each_phase_is_live_migrated_bit_identically(
        reference: Path, tmp_path: Path, phase: str) -> None:
    fault, ckpt = PHASES[phase]
    result, recs, out = _run(tmp_path, phase, faults=[fault], spares=1, ckpt=ckpt, sleep=0.1)
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(recs)
    # Parameters and AdamW state (moments and step counts) of both replicas, torch.equal.
    _assert_identical(reference, out, steps=STEPS)
    _assert_identical(reference, Path(f"{out}.rank1"), steps=STEPS)
    if phase == "checkpoint-write":
        ckpts = tmp_path / "runs" / phase / "checkpoints"
        assert list(ckpts.glob(".step-000000006.pt.tmp*")), "the write was not cut short"


def test_a_kill_during_a_checkpoint_write_without_spare_rolls_back_to_the_last_whole_one(
        reference: Path, tmp_path: Path) -> None:
    # Rank 0 dies writing the checkpoint of step 6: the torn file is never used; the
    # rollback goes to step 3's checkpoint and every step since is recorded lost.
    result, recs, out = _run(tmp_path, "ckpt-rb", faults=["kill:rank=0:step=6:phase=checkpoint"],
                             spares=0, ckpt=3, sleep=0.1)
    assert result.exit_code == 0, result
    [fail] = [r for r in recs if r["kind"] == "failure"]
    # Rank 0 committed step 6 before its writer died; its main thread may have committed
    # step 7 too.
    assert fail["step"] in (6, 7), fail
    assert _failures(recs) == [("unplanned", "process_killed", "rolled_back",
                                fail["step"] - 3)]
    _one_outcome_each(recs)
    _assert_identical(reference, out, steps=STEPS)


def test_a_compiled_model_survives_a_kill_bit_identically(tmp_path: Path) -> None:
    """``torch.compile`` (inductor, CPU) with bf16 autocast and accumulation: gradients
    still land in the runtime's flat buffers and a replacement (which compiles the same
    graph on its first step) ends bit-identical to a failure-free compiled run."""
    _, _, ref = _run(tmp_path, "c-ref", faults=[], spares=0, extra=("--compile",))
    result, recs, out = _run(tmp_path, "c", faults=["kill:rank=1:step=5:phase=backward"],
                             spares=1, extra=("--compile",), sleep=0.05)
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    _assert_identical(ref, out, steps=STEPS)
    _assert_identical(ref, Path(f"{out}.rank1"), steps=STEPS)


def test_gpt_example_under_yoco_run_with_a_phase_fault(reference: Path, tmp_path: Path) -> None:
    """``yoco run`` itself (the CLI), a phase fault given on its command line."""
    records = tmp_path / "records.jsonl"
    out = tmp_path / "cli.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "yoco.cli_runtime", "run", "--workers", "2", "--spares",
           "1", "--no-nvml", "--job-id", "cli", "--runs-root", str(tmp_path / "runs"),
           "--sink", f"jsonl:{records}",
           "--inject", "kill:rank=1:step=3:phase=forward:micro=1",
           GPT, "--steps", str(STEPS), "--out", str(out), "--step-sleep", "0.1", *TINY]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    recs = JsonlFileSink(records).read_all()
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    _assert_identical(reference, out, steps=STEPS)
