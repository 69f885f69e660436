"""The GPU checks (``scripts/gpu-check`` runs them: ``pytest -m gpu``). The CUDA/NCCL path
is written but has not run: this machine and CI have no GPU, so ordinary runs deselect
these tests (tests/conftest.py); under scripts/gpu-check a test that needs more GPUs than
the machine has skips with the reason. On a machine with the GPUs they assert
what the CPU tests assert on gloo: a SIGKILLed worker on its own GPU is replaced by a
spare on another, and the final state is bit-identical to a failure-free run (NCCL
gradient all-reduce, bf16 autocast on the device, deterministic kernels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.faults import parse_fault
from runtime.sink import JsonlFileSink
from runtime.supervisor import LaunchConfig, launch
from runtime.telemetry import NvmlSource, Reading
from tests.runtime.test_llm_loop import GPT, TINY, _one_outcome_each
from tests.runtime.test_migration import _assert_identical, _failures

pytestmark = pytest.mark.gpu

STEPS = 14


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _need(n: int, why: str) -> None:
    if (have := _gpus()) < n:
        pytest.skip(f"needs {n} CUDA device(s) ({why}); this machine has {have}"
                    + ("" if torch.version.cuda else f" and a CPU-only torch "
                       f"({torch.__version__})"))


def _run(tmp: Path, name: str, faults: list[str],
         spares: int) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=GPT, args=["--steps", str(STEPS), "--out", str(out),
                                         "--out-all-ranks", "--step-sleep", "0.1",
                                         "--deterministic", *TINY],
                       workers=2, spares=spares, job_id=name, contract_id="c-gpu",
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


def test_nvml_reads_every_gpu() -> None:
    _need(1, "NVML telemetry reads the GPUs' ECC, row-remap and temperature counters")
    src = NvmlSource()
    assert src.available, "NVML did not initialise on a machine with a CUDA device"
    readings = [r for r in src.poll() if isinstance(r, Reading)]
    assert {r.gpu for r in readings} >= set(range(_gpus())), readings
    temps = [r for r in readings if r.metric == "temperature_c"]
    assert temps and all(0 < r.value < 120 for r in temps), temps
