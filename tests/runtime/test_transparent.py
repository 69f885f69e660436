"""Transparent mode end to end: an unmodified torch.distributed script (no yoco import:
tests/runtime/scripts/ddp_mlp.py) under ``yoco run --transparent``, real worker processes
on gloo/CPU, real SIGKILLs, real records; the reference is the same script under plain
``torchrun`` with the real DistributedDataParallel."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from runtime.faults import parse_fault
from runtime.protocol import EXIT_FENCED
from runtime.sink import JsonlFileSink
from runtime.state import split_state
from runtime.supervisor import LaunchConfig, launch
from runtime.transparent import LAUNCHER
from tests.runtime.netns import Netns, NetnsCluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "runtime" / "scripts" / "ddp_mlp.py")
GPT = str(ROOT / "tests" / "runtime" / "scripts" / "ddp_gpt.py")
STEPS = 36  # 3 epochs of 12 batches per rank (384 samples, 2 ranks, batch 16)
# torchrun sets it for its workers; the same here so both run the same kernels.
ENV = {"OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(script: str, out: Path, nproc: int = 2, extra: tuple[str, ...] = ()) -> Path:
    """Rank 0's final state after ``script`` ran failure-free under plain torchrun."""
    env = {**os.environ, **ENV}
    for attempt in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
             "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script,
             "--out", str(out), *extra], env=env, capture_output=True, text=True,
            timeout=600)
        # The peer itself can abort as its interpreter ends on a loaded machine: a rank's
        # "terminate called without an active exception" (SIGABRT) after its loop, seen
        # once with four xdist workers (runtime/exitguard.py guards the runtime's own
        # workers against its kin; plain torchrun has no such guard). Its run is made
        # again once, and said so; any other failure, or a second one, fails the test.
        if proc.returncode == 0 or attempt == 2 \
                or "terminate called without an active exception" not in proc.stderr:
            break
        warnings.warn(f"plain torchrun of {script} aborted at a rank's exit; run again",
                      stacklevel=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP script's final state under plain torchrun."""
    return _torchrun(SCRIPT, tmp_path_factory.mktemp("torchrun") / "ref.pt")


def _run(tmp: Path, name: str, faults: list[str], *, extra: tuple[str, ...] = (),
         spares: int = 1, ckpt: int = 5,
         script: str = SCRIPT) -> tuple[Any, list[dict[str, Any]], Path]:
    out = tmp / f"{name}.pt"
    sink = JsonlFileSink(tmp / f"{name}.records.jsonl")
    cfg = LaunchConfig(script=LAUNCHER, args=[script, "--out", str(out), *extra],
                       workers=2, spares=spares, job_id=name, contract_id="c-test",
                       runs_root=str(tmp / "runs"), checkpoint_every=ckpt,
                       faults=[parse_fault(f) for f in faults], nvml=False,
                       progress_interval_s=0.5, env=dict(ENV))
    result = launch(cfg, sink)
    return result, sink.read_all(), out


def _state(path: Path) -> tuple[dict[str, Any], list[torch.Tensor]]:
    state = torch.load(path)
    return state, split_state({"m": state["model"], "o": state["optimizer"]})[1]


def _assert_identical(reference: Path, got: Path) -> None:
    ref, ta = _state(reference)
    out, tb = _state(got)
    assert ref["scheduler"] == out["scheduler"]
    assert ref.get("scaler") == out.get("scaler")
    assert len(ta) == len(tb) > 0
    for x, y in zip(ta, tb, strict=True):
        assert torch.equal(x, y)


def _failures(recs: list[dict[str, Any]]) -> list[tuple[str, str, str, int]]:
    """(class, cause, outcome, lost_steps) per failure, in order."""
    outcomes = {r["failure_event_id"]: r for r in recs if r["kind"] == "outcome"}
    return [(r["failure_class"], r["cause"], outcomes[r["event_id"]]["outcome"],
             outcomes[r["event_id"]]["lost_steps"]) for r in recs if r["kind"] == "failure"]


def _every_rank_killed_at_step_20(tmp: Path, name: str,
                                  extra: tuple[str, ...] = ()) -> tuple[Any, Path]:
    """Both ranks SIGKILLed in the forward pass of step 20; assert the one failure was
    rolled back with its true lost steps and the job reached its full length."""
    result, recs, out = _run(tmp, name, ["kill:rank=0:step=20:phase=forward",
                                         "kill:rank=1:step=20:phase=forward"], extra=extra)
    assert result.exit_code == 0, result
    got = _failures(recs)
    assert len(got) == 1 and got[0][:3] == ("unplanned", "process_killed", "rolled_back"), got
    # Back to a checkpoint (every 5 steps, written in the background) before the step
    # committed when they died: 20, or 19 as far as the supervisor had heard of when it
    # recorded or planned it (it polls rank 0's progress).
    fail = next(r for r in recs if r["kind"] == "failure")
    assert fail["step"] in (19, 20)
    lost = got[0][3]
    assert any((k - lost) % 5 == 0 and 0 <= k - lost < 20 for k in (19, 20)), lost
    assert result.final_step == STEPS
    return result, out


def test_kills_in_each_phase_are_live_and_bit_identical_to_torchrun(
        torchrun_reference: Path, tmp_path: Path) -> None:
    """SIGKILL of a rank in the reduction, the forward pass (an epoch later: the
    replacement's loader skips a whole iteration), the backward pass (the first batch of
    the last epoch) and right after its own update: each time a spare receives the state
    from the survivor (parameters, AdamW, the cosine schedule, the data position, the dead
    rank's RNG states for its dropout) and the script goes on; the final state is the one
    plain torchrun ends with, bit for bit."""
    faults = ["kill:rank=1:step=5", "kill:rank=0:step=17:phase=forward",
              "kill:rank=1:step=24:phase=backward", "kill:rank=0:step=30:phase=optimizer"]
    result, recs, out = _run(tmp_path, "kills", faults)
    assert result.exit_code == 0, result
    assert result.final_step == STEPS
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)] * 4
    _assert_identical(torchrun_reference, out)


def test_a_small_gpt_with_clipping_survives_kills_bit_identically(tmp_path: Path) -> None:
    """A small GPT (attention with dropout, two AdamW parameter groups, warm-up then
    cosine through LambdaLR, ``clip_grad_norm_`` between backward and step -- which must
    see the averaged gradient, as under DDP): kills in the backward pass and in the
    reduction, live, and the final state equals torchrun's bit for bit."""
    reference = _torchrun(GPT, tmp_path / "gpt-ref.pt")
    result, recs, out = _run(tmp_path, "gpt", ["kill:rank=1:step=6:phase=backward",
                                               "kill:rank=0:step=21"], script=GPT)
    assert result.exit_code == 0, result
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)] * 2
    _assert_identical(reference, out)


def test_a_drain_and_a_warning_move_live_ranks_bit_identically(
        torchrun_reference: Path, tmp_path: Path) -> None:
    """Planned (drain) and pre-emptive (telemetry warning) moves of a live rank: it sends
    its state to a spare at the next step boundary and leaves."""
    # A move waits for a ready spare: steps of a few milliseconds could end the job before
    # both spares are up (one CI run had the first ready at step 30), so each step takes
    # 0.1 s more here -- the numbers are the same as without the sleep.
    result, recs, out = _run(tmp_path, "moves",
                             ["drain:rank=0:step=8", "warn:rank=1:step=20"], spares=2,
                             extra=("--step-sleep", "0.1"))
    assert result.exit_code == 0, result
    got = _failures(recs)
    # (In either order: a drain waits until a spare is ready, a warning may overtake it.)
    assert sorted((c, o, lost) for c, _, o, lost in got) == [
        ("planned", "live_migrated", 0), ("preemptive", "live_migrated", 0)], got
    _assert_identical(torchrun_reference, out)


def test_an_undiscoverable_iterator_rolls_back_with_the_true_lost_steps(
        tmp_path: Path) -> None:
    """The same script feeding its batches from a generator (no DataLoader): the runtime
    cannot place a replacement in the data, so the job recovers by rollback to the
    runtime's own checkpoint; the survivors' data is not rewound, so the steps since the
    checkpoint and the interrupted one are lost -- the record says how many, and the job
    ends exactly that many steps short."""
    result, recs, out = _run(tmp_path, "custom", ["kill:rank=1:step=7"],
                             extra=("--custom-iterator",))
    assert result.exit_code == 0, result
    got = _failures(recs)
    assert len(got) == 1 and got[0][:3] == ("unplanned", "process_killed", "rolled_back"), got
    lost = got[0][3]
    assert lost >= 3  # steps 5 and 6 at least (checkpoint every 5), and the interrupted one
    assert result.final_step == STEPS - lost
    state, _ = _state(out)
    assert state["scheduler"]["last_epoch"] == STEPS - lost  # one schedule step per update
    finished = [r for r in recs if r["kind"] == "job_finished"]
    assert finished and finished[0]["step"] == STEPS - lost


def test_every_rank_lost_rolls_back_with_the_data_rewound(tmp_path: Path) -> None:
    """Both ranks SIGKILLed in the forward pass of the same step (neither can reach a
    collective first, so both die): no replica holds the state, the fresh processes load
    the runtime's newest checkpoint and are placed at its data position (nobody's script
    is past it): the lost steps are redone and the job ends at its full length."""
    _, out = _every_rank_killed_at_step_20(tmp_path, "killall")
    state, _ = _state(out)
    assert state["scheduler"]["last_epoch"] == STEPS


def test_the_cli_runs_an_unmodified_script(torchrun_reference: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``yoco run --transparent`` (the command customers type), failure-free: the same
    state as torchrun's."""
    from yoco.cli import build_app

    out = tmp_path / "cli.pt"
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    res = CliRunner().invoke(build_app(), [
        "run", "--transparent", "--workers", "2", "--spares", "0", "--no-nvml",
        "--runs-root", str(tmp_path / "runs"), "--sink",
        f"jsonl:{tmp_path / 'cli.jsonl'}", SCRIPT, "--out", str(out)])
    assert res.exit_code == 0, res.output
    _assert_identical(torchrun_reference, out)
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "cli.jsonl").open()]
    assert kinds[0] == "job_started" and kinds[-1] == "job_finished"


def test_alone_it_is_the_script_under_torchrun_with_one_process(tmp_path: Path) -> None:
    """``python -m runtime.transparent SCRIPT`` outside the launcher: one process, world
    size 1, the same state as torchrun with one process (DDP of one rank)."""
    reference = _torchrun(SCRIPT, tmp_path / "one.pt", nproc=1)
    out = tmp_path / "alone.pt"
    proc = subprocess.run([sys.executable, "-m", "runtime.transparent", SCRIPT, "--out",
                           str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_identical(reference, out)
    assert torch.load(out)["scheduler"]["last_epoch"] == 2 * STEPS  # 24 batches an epoch


def test_an_unsupported_collective_stops_with_a_clear_error(tmp_path: Path) -> None:
    """A use of torch.distributed the transparent mode does not replace is refused by
    name, not run on a group the runtime does not control."""
    script = tmp_path / "allreduce.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "dist.all_reduce(torch.ones(1))\n")
    proc = subprocess.run([sys.executable, "-m", "runtime.transparent", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **ENV})
    assert proc.returncode != 0
    assert "torch.distributed.all_reduce is not supported in transparent mode" in proc.stderr


def test_two_optimizers_step_as_one_boundary_live_and_bit_identically(
        tmp_path: Path) -> None:
    """Two optimizers over two parts of the model (AdamW for the hidden layer, SGD with
    momentum and its own step schedule for the output layer), both stepped each
    iteration: the boundary is the last of them. Kills in the reduction and right after
    the first optimizer's update (before the second's): live, both optimizers' and both
    schedules' states move, and the final state is torchrun's bit for bit. The script
    zeroes its gradients in place (``zero_grad(set_to_none=False)``), so the survivor's
    retry after the kill in the reduction takes its local gradient from a copy of the
    buffers, not from the tensors backward left (the other tests' path)."""
    extra = ("--two-optimizers", "--keep-grads")
    reference = _torchrun(SCRIPT, tmp_path / "two-ref.pt", extra=extra)
    result, recs, out = _run(tmp_path, "two", ["kill:rank=1:step=5",
                                               "kill:rank=0:step=19:phase=optimizer"],
                             extra=extra)
    assert result.exit_code == 0, result
    assert result.final_step == STEPS
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)] * 2
    _assert_identical(reference, out)
    state = torch.load(out)
    assert [len(o["state"]) for o in state["optimizer"]] == [2, 2]
    assert [sd["last_epoch"] for sd in state["scheduler"]] == [STEPS, STEPS]


def test_two_optimizers_roll_back_together_with_the_true_lost_steps(tmp_path: Path) -> None:
    """Both ranks of the two-optimizer script SIGKILLed in the same forward pass: no
    replica holds the state, so both optimizers (AdamW and SGD with momentum), both
    schedules and the data position come back together from the runtime's newest
    checkpoint; the lost steps are redone and the job ends at its full length with every
    state at that length (a rollback is not bit-identical with dropout: the RNG states are
    not checkpointed, docs/runtime.md)."""
    _, out = _every_rank_killed_at_step_20(tmp_path, "two-rollback",
                                           extra=("--two-optimizers",))
    state = torch.load(out)
    assert [sd["last_epoch"] for sd in state["scheduler"]] == [STEPS, STEPS]
    adamw, sgd = state["optimizer"]
    assert [int(s["step"]) for s in adamw["state"].values()] == [STEPS, STEPS]
    assert len(sgd["state"]) == 2
    assert all("momentum_buffer" in s for s in sgd["state"].values())
    # StepLR halves the head's rate every 10 steps: the schedule came back with the rest.
    assert sgd["param_groups"][0]["lr"] == pytest.approx(0.05 * 0.5 ** (STEPS // 10))


def test_a_grad_scaler_moves_its_scale_live_and_bit_identically(tmp_path: Path) -> None:
    """fp16 autocast with a ``torch.amp.GradScaler`` whose scale grows until the
    gradients overflow (steps whose update the scaler skips, on every rank alike): kills in
    the reduction and in the backward pass are live, the scale and growth tracker move
    with the rest, and the final state -- the scaler's included -- is torchrun's bit for
    bit."""
    extra = ("--grad-scaler",)
    reference = _torchrun(SCRIPT, tmp_path / "amp-ref.pt", extra=extra)
    ref = torch.load(reference)
    skipped = STEPS - int(ref["optimizer"]["state"][0]["step"])
    assert skipped > 0  # the scaler did skip updates
    result, recs, out = _run(tmp_path, "amp", ["kill:rank=1:step=6",
                                               "kill:rank=0:step=23:phase=backward"],
                             extra=extra)
    assert result.exit_code == 0, result
    assert result.final_step == STEPS  # a skipped update is still a step of the job
    assert _failures(recs) == [("unplanned", "process_killed", "live_migrated", 0)] * 2
    _assert_identical(reference, out)
    assert torch.load(out)["scaler"]["scale"] == ref["scaler"]["scale"]


def test_an_optimizer_stepped_at_its_own_rate_is_refused(tmp_path: Path) -> None:
    """Two optimizers, the second stepped every other iteration only: a training step
    is not one update of each, so there is no step boundary to place a replacement at:
    refused by name, rather than committing at the wrong place."""
    script = tmp_path / "rates.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset\n"
        "dist.init_process_group('gloo')\n"
        "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
        "a = torch.optim.SGD([m.module.weight], lr=0.1)\n"
        "b = torch.optim.SGD([m.module.bias], lr=0.1)\n"
        "ds = TensorDataset(torch.randn(32, 4))\n"
        "loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds))\n"
        "for i, (x,) in enumerate(loader):\n"
        "    m(x).sum().backward()\n"
        "    a.step()\n"
        "    if i % 2:\n"
        "        b.step()\n")
    proc = subprocess.run([sys.executable, "-m", "runtime.transparent", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **ENV})
    assert proc.returncode != 0
    assert ("optimizer 0 (of 2, in construction order) was stepped twice before "
            "optimizer(s) [1] stepped once") in proc.stderr, proc.stderr[-3000:]


def test_a_frozen_host_on_another_machine_is_moved_live_and_bit_identically(
        torchrun_reference: Path, netns: Callable[[int], Netns], tmp_path: Path) -> None:
    """Transparent mode across machines: the unmodified script's two ranks on two hosts
    in network namespaces of their own (own machine id: the coordinator can neither read
    nor signal the other host) and a spare host. Host 1 freezes mid-training (everything
    on it SIGSTOPped): it is fenced as hung after its silence, the survivor's rank sends
    the state the runtime discovered to the spare host's process, the script goes on and
    ends bit-identical to plain torchrun; thawed, the fenced host finds it was fenced and
    exits 5 without having written anything into the live generation."""
    net = netns(3)
    out = tmp_path / "final.pt"
    c = NetnsCluster(net, tmp_path, script=LAUNCHER,
                     script_args=[SCRIPT, "--out", str(out), "--step-sleep", "0.1"],
                     nnodes="2:+1", nproc=1,
                     extra=["--checkpoint-every", "5", "--progress-every", "0.2",
                            "--node-timeout", "2"])
    c.env.update(ENV)
    try:
        c.start_all()
        c.progress_at(8)
        net.freeze(1)
        c.wait_until(lambda: any(r["kind"] == "outcome" for r in c.outbox()), "the outcome")
        net.thaw(1)
        assert c.wait(0) == 0, c.logs()
        assert c.wait(2) == 0, c.logs()
        assert c.wait(1, timeout=60) == EXIT_FENCED, c.logs()
    finally:
        c.close()
    recs = c.records()
    fails = [r for r in recs if r["kind"] == "failure"]
    assert [(f["node"], f["cause"]) for f in fails] == [("host1", "hang")], c.logs()
    assert _failures(recs) == [("unplanned", "hang", "live_migrated", 0)]
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == STEPS
    assert "node host1 was fenced by the coordinator (hang: node host1 silent" in c.log(1)
    _assert_identical(torchrun_reference, out)
