"""The GPU checks (``scripts/gpu-check`` runs them: ``pytest -m gpu``). The CUDA/NCCL path
is written but has not run: this machine and CI have no GPU, so ordinary runs deselect
these tests (tests/conftest.py); under scripts/gpu-check a test that needs more GPUs than
the machine has skips with the reason. On a machine with the GPUs they assert
what the CPU tests assert on gloo: a SIGKILLed worker on its own GPU is replaced by a
spare on another, and the final state is bit-identical to a failure-free run (NCCL
gradient all-reduce, bf16 autocast on the device, deterministic kernels); the same for
HSDP (FSDP2's all-gathers and reduce-scatters and the cross-group reduction on NCCL
subgroups, the runtime's control on gloo ones, the shard sent to the spare over NCCL),
and the HSDP example alone on one GPU."""

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
from runtime.telemetry import NvmlSource, Reading
from tests.runtime.test_hsdp import SHARDS, WORKERS, _assert_every_shard_identical
from tests.runtime.test_llm_loop import GPT, TINY, _one_outcome_each
from tests.runtime.test_migration import ROOT, _assert_identical, _failures

pytestmark = pytest.mark.gpu

STEPS = 14


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _need(n: int, why: str) -> None:
    if (have := _gpus()) < n:
        pytest.skip(f"needs {n} CUDA device(s) ({why}); this machine has {have}"
                    + ("" if torch.version.cuda else f" and a CPU-only torch "
                       f"({torch.__version__})"))


def _run(tmp: Path, name: str, faults: list[str], spares: int, *, workers: int = 2,
         shards: int = 1) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=GPT, args=["--steps", str(STEPS), "--out", str(out),
                                         "--out-all-ranks", "--step-sleep", "0.1",
                                         "--deterministic", *TINY,
                                         *(["--fsdp"] if shards > 1 else [])],
                       workers=workers, shards=shards, spares=spares, job_id=name,
                       contract_id="c-gpu",
                       runs_root=str(tmp / "runs"), faults=[parse_fault(f) for f in faults],
                       nvml=True, progress_interval_s=0.5)
    return launch(cfg, sink), sink.read_all(), out


def test_ddp_on_cuda_survives_a_kill_bit_identically(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _need(3, "one per worker and one for the spare: NCCL refuses two ranks on one GPU")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # inherited by the workers
    ref_result, ref_recs, ref = _run(tmp_path, "ref", [], spares=0)
    assert ref_result.exit_code == 0, ref_result
    assert "failure" not in [r["kind"] for r in ref_recs]
    result, recs, out = _run(tmp_path, "kill", ["kill:rank=1:step=5:phase=backward"],
                             spares=1)
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(recs)
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert isinstance(fail.get("gpu"), int), fail  # on CUDA the record names the GPU
    _assert_identical(ref, out, steps=STEPS)
    _assert_identical(ref, Path(f"{out}.rank1"), steps=STEPS)
    # The state was trained on the GPUs (saved from there).
    assert torch.load(out, map_location="cpu")["step"] == STEPS


def test_hsdp_on_cuda_survives_a_kill_bit_identically(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _need(WORKERS + 1, "2 replica groups x 2 shards and a spare, one GPU each: NCCL "
                       "refuses two ranks of one group on one GPU")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    ref_result, ref_recs, ref = _run(tmp_path, "ref", [], spares=0, workers=WORKERS,
                                     shards=SHARDS)
    assert ref_result.exit_code == 0, ref_result
    assert "failure" not in [r["kind"] for r in ref_recs]
    # Rank 2 (replica group 1, shard 0) dies in FSDP2's backward: its shard-group peer
    # keeps its process, the spare receives shard 0 from rank 0 over NCCL.
    result, recs, out = _run(tmp_path, "kill", ["kill:rank=2:step=5:phase=backward"],
                             spares=1, workers=WORKERS, shards=SHARDS)
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)]
    _one_outcome_each(recs)
    [fail] = [r for r in recs if r["kind"] == "failure"]
    assert isinstance(fail.get("gpu"), int), fail
    _assert_every_shard_identical(ref, out)  # saved from the GPUs, compared bit for bit


def test_hsdp_example_runs_alone_on_one_gpu(tmp_path: Path) -> None:
    # FSDP2 over the runtime's shard mesh of one, on the CUDA device: the mesh is a CUDA
    # mesh, the shards, the local-shard AdamW step and the sharded clipping run there.
    _need(1, "the HSDP example alone on a CUDA device")
    env = {k: v for k, v in os.environ.items() if not k.startswith("YOCO_")}
    env.update(PYTHONPATH=str(ROOT), YOCO_DEVICE="cuda:0", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    out = tmp_path / "alone.pt"
    proc = subprocess.run([sys.executable, GPT, "--steps", "4", "--fsdp", "--deterministic",
                           "--out", str(out), *TINY], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    state = torch.load(out)
    assert state["step"] == 4
    assert {t.device.type for t in state["model"].values()} == {"cuda"}


def test_nvml_reads_every_gpu() -> None:
    _need(1, "NVML telemetry reads the GPUs' ECC, row-remap and temperature counters")
    src = NvmlSource()
    assert src.available, "NVML did not initialise on a machine with a CUDA device"
    readings = [r for r in src.poll() if isinstance(r, Reading)]
    assert {r.gpu for r in readings} >= set(range(_gpus())), readings
    temps = [r for r in readings if r.metric == "temperature_c"]
    assert temps and all(0 < r.value < 120 for r in temps), temps
