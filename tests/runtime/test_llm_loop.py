"""The training loop LLM trainers write, under the runtime with real processes:
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
from tests.runtime.conftest import Reference
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
         env: dict[str, str] | None = None) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=GPT, args=["--steps", str(STEPS), "--out", str(out),
                                         "--out-all-ranks", "--step-sleep", str(sleep),
                                         *TINY, *extra],
                       workers=workers, spares=spares, job_id=name, contract_id="c-test",
                       runs_root=str(tmp / "runs"), checkpoint_every=ckpt,
                       faults=[parse_fault(f) for f in faults], nvml=False,
                       progress_interval_s=0.5, env=env or {})
    result = launch(cfg, sink)
    return result, sink.read_all(), out


def _one_outcome_each(recs: list[dict[str, Any]]) -> None:
    fails = [r["event_id"] for r in recs if r["kind"] == "failure"]
    outs = [r["failure_event_id"] for r in recs if r["kind"] == "outcome"]
    assert sorted(fails) == sorted(outs), (fails, outs)


@pytest.fixture
def reference(failure_free: Reference) -> Path:
    out = failure_free(GPT, ["--steps", str(STEPS), "--out-all-ranks", *TINY], workers=2)
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


# The phase names where in the step the rank dies: one kill in each, in one job. Steps
# are 0-based; a kill in the forward, backward or reduce phase of step T leaves T to be
# done again, one in the optimizer phase lets the survivor commit it, and the checkpoint
# one fires while the checkpoint of committed step T is written. Two steps lie between
# each recovery and the next kill (the step cannot advance while one is under way, and
# a new generation is over with its first step), and at 0.6 s a step that is more than
# the supervisor's 1 s merge window, within which deaths are one incident by design.
PHASES = {
    "forward-mid-accumulation": "kill:rank=1:step=1:phase=forward:micro=1",
    "backward": "kill:rank=0:step=3:phase=backward:micro=0",
    "reduce": "kill:rank=1:step=5:phase=reduce",
    "optimizer": "kill:rank=1:step=7:phase=optimizer",
    "checkpoint-write": "kill:rank=0:step=10:phase=checkpoint",
}


def test_a_kill_in_each_phase_is_live_migrated_bit_identically(
        reference: Path, tmp_path: Path) -> None:
    result, recs, out = _run(tmp_path, "phases", faults=list(PHASES.values()), spares=2,
                             ckpt=5, sleep=0.6)
    assert result.exit_code == 0, result
    # One failure per kill, each with one outcome: a live migration, no step lost.
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)] * 5
    _one_outcome_each(recs)
    # Each failure is its own kill, recorded at the step committed when it died: T, or
    # T + 1 where the survivor may have completed it (its allreduce had the dead rank's
    # gradient: reduce, optimizer). The writer of T's checkpoint is a thread that runs
    # behind the training loop by as many steps as the machine's load makes it (3 steps
    # in a loaded CI run): a kill in it is recorded at the step committed by then, T or
    # later, never earlier.
    steps = [r["step"] for r in recs if r["kind"] == "failure"]
    assert all(s in (t, t + 1) for s, t in zip(steps[:4], (1, 3, 5, 7), strict=True)), steps
    assert 10 <= steps[4] <= STEPS, steps
    # Parameters and AdamW state (moments and step counts) of both replicas, torch.equal.
    _assert_identical(reference, out, steps=STEPS)
    _assert_identical(reference, Path(f"{out}.rank1"), steps=STEPS)
    ckpts = tmp_path / "runs" / "phases" / "checkpoints"
    assert list(ckpts.glob(".step-000000010.pt.tmp*")), "the write was not cut short"


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


#: Inductor compiles its kernels in-process: its default pool of compile workers is one
#: more interpreter importing torch per worker (and per replacement), which on 2 cores
#: costs more than it saves for this tiny model. The kernels are the same.
COMPILE_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def test_a_compiled_model_survives_a_kill_bit_identically(
        tmp_path: Path, failure_free: Reference) -> None:
    """``torch.compile`` (inductor, CPU) with bf16 autocast and accumulation: gradients
    still land in the runtime's flat buffers and a replacement (which compiles the same
    graph on its first step) ends bit-identical to a failure-free compiled run."""
    ref = failure_free(GPT, ["--steps", str(STEPS), "--out-all-ranks", *TINY, "--compile"],
                       workers=2, env=COMPILE_ENV)
    result, recs, out = _run(tmp_path, "c", faults=["kill:rank=1:step=5:phase=backward"],
                             spares=1, extra=("--compile",), sleep=0.05, env=COMPILE_ENV)
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
