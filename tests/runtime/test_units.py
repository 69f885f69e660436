"""Fault specs, telemetry policy and sources, sampler, state split (fast)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from runtime.control import drain, take_requests, write_status
from runtime.data import ShardedSampler
from runtime.errors import ConfigError, DrainError, FaultSpecError, NoSpareError
from runtime.faults import decode_faults, encode_faults, parse_fault
from runtime.state import join_state, pack, split_state, unpack
from runtime.telemetry import (
    CommandSignalSource,
    FileSignalSource,
    NvmlSource,
    Reading,
    Signal,
    WarningPolicy,
)


def test_fault_specs_round_trip() -> None:
    faults = [parse_fault("kill:rank=1:step=5"), parse_fault("killall:step=9"),
              parse_fault("warn:rank=0:step=3:signal=thermal"),
              parse_fault("linger:rank=1:step=40:seconds=2.5"),
              parse_fault("lag:rank=1:step=0:seconds=20"),
              parse_fault("slow:rank=1:step=6:seconds=1.5")]
    assert decode_faults(encode_faults(faults)) == faults
    assert (faults[-2].action, faults[-2].rank, faults[-2].seconds) == ("lag", 1, 20.0)
    assert faults[-3].seconds == 2.5 and parse_fault("linger:rank=0:step=3").seconds == 3.0
    assert (faults[-1].action, faults[-1].seconds) == ("slow", 1.5)
    for bad in ("kill:step=1", "boom:rank=1:step=1", "kill:rank=1", "killall:rank=1:step=2",
                "warn:rank=1:step=2:signal=nope", "kill:rank=x:step=1",
                "linger:rank=1:step=3:seconds=-1", "linger:rank=1:step=3:seconds=nan",
                "linger:rank=1:step=3:seconds=x", "linger:step=3", "slow:step=3",
                "slow:rank=0:step=3:seconds=-2", "slow:rank=0:step=3:phase=forward",
                "lag:rank=1:step=4", "lag:step=0"):
        with pytest.raises(FaultSpecError):
            parse_fault(bad)


def test_kill_faults_name_the_phase_of_the_step() -> None:
    f = parse_fault("kill:rank=1:step=4:phase=forward:micro=2")
    assert (f.action, f.rank, f.step, f.phase, f.micro) == ("kill", 1, 4, "forward", 2)
    assert parse_fault("kill:rank=0:step=3").phase == "reduce"  # as before phases existed
    faults = [f, parse_fault("kill:rank=0:step=6:phase=checkpoint")]
    assert decode_faults(encode_faults(faults)) == faults
    for bad, why in (("kill:rank=1:step=4:phase=sideways", "phase must be one of"),
                     ("raise:rank=1:step=4:phase=forward", "kill only"),
                     ("kill:rank=1:step=4:phase=optimizer:micro=1", "forward and backward"),
                     ("kill:rank=1:step=4:phase=forward:micro=-1", "micro must be"),
                     ("kill:rank=1:step=4:micro=x", "bad number")):
        with pytest.raises(FaultSpecError, match=why):
            parse_fault(bad)


def test_policy_turns_readings_into_signals() -> None:
    pol = WarningPolicy(corrected_ecc_delta=10)
    assert pol.evaluate([Reading(metric="ecc_corrected", value=5, gpu=0)]) == []
    sig = pol.evaluate([Reading(metric="ecc_corrected", value=20, gpu=0),
                        Reading(metric="ecc_uncorrected", value=1, gpu=1),
                        Reading(metric="remap_pending", value=1, gpu=2),
                        Reading(metric="temperature_c", value=86, gpu=3, slowdown_c=90),
                        Reading(metric="temperature_c", value=60, gpu=3, slowdown_c=90),
                        Reading(metric="xid", value=79, gpu=4),
                        Reading(metric="xid", value=13, gpu=4)])
    assert [(s.cause, s.gpu) for s in sig] == [("ecc_rising", 0), ("ecc_uncorrectable", 1),
                                               ("row_remap_pending", 2), ("thermal", 3),
                                               ("xid", 4)]
    with pytest.raises(ValueError):
        WarningPolicy(corrected_ecc_delta=0)


def test_file_and_command_sources(tmp_path: Path) -> None:
    f = tmp_path / "sig.jsonl"
    src = FileSignalSource(f)
    assert src.poll() == []
    f.write_text('{"worker": "w1", "cause": "ecc_rising"}\n{"gpu": 0, "metric": "xid", '
                 '"value": 79}\n{"worker": "w2", "cau')
    got = src.poll()
    assert got == [Signal(cause="ecc_rising", worker="w1"),
                   Reading(metric="xid", value=79.0, gpu=0)]
    with f.open("a") as fh:
        fh.write('se": "thermal"}\n')
    assert src.poll() == [Signal(cause="thermal", worker="w2")]
    cmd = CommandSignalSource("echo '{\"worker\": \"w0\", \"cause\": \"xid\"}'")
    assert cmd.poll() == [Signal(cause="xid", worker="w0")]
    assert CommandSignalSource("/nonexistent/cmd").poll() == []


def test_nvml_source_degrades_without_a_gpu() -> None:
    src = NvmlSource()
    if not torch.cuda.is_available():
        assert not src.available and src.poll() == []


def test_sampler_is_deterministic_and_resumable() -> None:
    a = ShardedSampler(100, 4, seed=3)
    first = [a.next_batch(r, 2) for r in (0, 1)]
    assert not set(first[0].tolist()) & set(first[1].tolist())
    state = a.state_dict()
    nxt = a.next_batch(0, 2)
    b = ShardedSampler(100, 4, seed=3)
    b.load_state_dict(state)
    assert torch.equal(b.next_batch(0, 2), nxt)


def test_state_split_pack_round_trip() -> None:
    state = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
             "b": [torch.tensor(3.0), {"c": torch.tensor([True, False])}], "n": 5}
    skel, ts = split_state(state)
    back = join_state(skel, [t.clone() for t in ts])
    assert back["n"] == 5 and torch.equal(back["a"], state["a"])
    from runtime.state import refs
    r = refs(skel)
    again = unpack(pack(ts), r)
    assert all(torch.equal(x, y) for x, y in zip(again, ts, strict=True))


def test_drain_request_files(tmp_path: Path) -> None:
    run = tmp_path / "job1"
    run.mkdir()
    with pytest.raises(DrainError):
        drain("job1", "w1", runs_root=tmp_path)
    write_status(run, {"state": "running", "members": ["w0", "w3"]})
    assert drain("job1", "1", runs_root=tmp_path) == "w3"
    with pytest.raises(DrainError):
        drain("job1", "w9", runs_root=tmp_path)
    reqs = take_requests(run / "control")
    assert [r["worker"] for r in reqs] == ["w3"] and take_requests(run / "control") == []
    json.dumps(reqs)
    # A job started without spares: refused, nothing filed.
    write_status(run, {"state": "running", "members": ["w0", "w3"], "spares": [],
                       "spares_configured": 0})
    with pytest.raises(NoSpareError, match="no spare"):
        drain("job1", "w3", runs_root=tmp_path)
    assert take_requests(run / "control") == []


def test_process_exiting_sees_a_kill_before_the_exit_status() -> None:
    import signal
    import subprocess
    import time

    from runtime.supervisor import process_exiting

    p = subprocess.Popen(["sleep", "30"])
    try:
        assert not process_exiting(p.pid)
        p.send_signal(signal.SIGKILL)
        deadline = time.time() + 5
        while not process_exiting(p.pid):
            assert time.time() < deadline
            time.sleep(0.001)
    finally:
        p.kill()
        p.wait()
    assert process_exiting(p.pid)  # reaped: gone


def test_stat_files_are_held_per_process_closed_when_it_is_gone_and_bounded() -> None:
    import subprocess

    from runtime.processes import _StatFiles

    files = _StatFiles()
    files.MAX = 2
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        first = files.read(procs[0].pid)
        assert first is not None and first.startswith(f"{procs[0].pid} (sleep) ".encode())
        assert files.read(procs[0].pid) is not None  # the same file, read again
        for p in procs[1:]:
            assert files.read(p.pid) is not None
        assert len(files._fds) == 2 and procs[0].pid not in files._fds  # oldest closed
        held = files._fds[procs[1].pid]
        procs[1].kill()
        procs[1].wait()  # reaped: the held file now fails, whatever gets the number
        assert files.read(procs[1].pid) is None
        assert procs[1].pid not in files._fds
        with pytest.raises(OSError):
            os.fstat(held)  # closed
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_process_stopped_is_true_only_while_stopped() -> None:
    # The stopped-rank watchdog's confirmation: T while SIGSTOPped, not while sleeping,
    # running, after SIGCONT, or once gone.
    import signal
    import subprocess
    import time

    from runtime.processes import process_stopped

    p = subprocess.Popen(["sleep", "30"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert not process_stopped(p.pid) and not process_stopped(busy.pid)
        for proc in (p, busy):
            proc.send_signal(signal.SIGSTOP)
            deadline = time.time() + 5
            while not process_stopped(proc.pid):
                assert time.time() < deadline
                time.sleep(0.001)
            proc.send_signal(signal.SIGCONT)
            while process_stopped(proc.pid):
                assert time.time() < deadline
                time.sleep(0.001)
    finally:
        for proc in (p, busy):
            proc.kill()
            proc.wait()
    assert not process_stopped(p.pid)  # reaped: gone


def test_stopped_deadline_is_three_steps_with_a_floor() -> None:
    from runtime.processes import STOPPED_FLOOR_S, stopped_deadline
    from runtime.supervisor import LaunchConfig

    assert stopped_deadline(0.2, 3.0) == pytest.approx(0.6)
    assert stopped_deadline(0.01, 3.0) == STOPPED_FLOOR_S == stopped_deadline(0.0, 3.0)
    with pytest.raises(ConfigError, match="hang_stopped_factor"):
        LaunchConfig(script=__file__, hang_stopped_factor=-1.0)
    assert LaunchConfig(script=__file__, hang_stopped_factor=0.0).hang_stopped_factor == 0.0


def test_sparse_gradients_stack_and_split_back_exactly() -> None:
    from runtime.job import stack_sparse, unstack_sparse

    torch.manual_seed(0)
    tables = [torch.nn.Embedding(n, 4, sparse=True) for n in (5, 7, 3)]
    ids = [torch.tensor([0, 4, 4, 1]), torch.tensor([6, 6]), None]  # table 3 untouched
    for t, i in zip(tables, ids, strict=True):
        if i is not None:
            t(i).pow(2).sum().backward()
    grads = [t.weight.grad for t in tables]
    shapes = [t.weight.shape for t in tables]
    stacked = stack_sparse(grads, shapes)
    assert stacked.shape == (15, 4)
    parts = unstack_sparse(stacked, shapes)
    for g, part, shape in zip(grads, parts, shapes, strict=True):
        assert part.is_sparse and part.is_coalesced() and part.shape == shape
        want = g.to_dense() if g is not None else torch.zeros(shape)
        assert torch.equal(part.to_dense(), want)
    assert parts[2]._nnz() == 0
    # Nothing at all, in float64: an empty reduction of the right shape and dtype.
    empty = stack_sparse([None, None], shapes[:2], torch.float64)
    assert empty.dtype == torch.float64 and empty._nnz() == 0 and empty.shape == (12, 4)


EXAMPLE_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "mlp_train.py")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("workers", 0, "workers"),
    ("spares", -1, "spares"),
    ("checkpoint_every", -1, "checkpoint_every"),
    ("contract_id", "", "contract_id"),
    ("job_id", "a/b", "job_id"),
    ("script", "/nonexistent/train.py", "does not exist"),
    ("progress_interval_s", 0, "progress_interval_s"),
    ("store_poll_interval_s", 0, "store_poll_interval_s"),
    ("finish_timeout_s", -1, "finish_timeout_s"),
    ("max_recoveries", 0, "max_recoveries"),
])
def test_launch_config_refuses_bad_values_naming_the_field(field: str, value: object,
                                                           message: str) -> None:
    from runtime.errors import ConfigError
    from runtime.supervisor import LaunchConfig

    kwargs: dict[str, object] = {"script": EXAMPLE_SCRIPT, field: value}
    with pytest.raises(ConfigError, match=message):
        LaunchConfig(**kwargs)  # type: ignore[arg-type]
    LaunchConfig(script=EXAMPLE_SCRIPT)  # the defaults are valid


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"checkpoint_every": -1}, "checkpoint_every"),
    ({"checkpoint_every": 5}, "checkpoint_dir"),
    ({"poll_interval_s": 0}, "poll_interval_s"),
    ({"poll_interval_s": 2}, "poll_interval_s"),
    ({"regroup_timeout_s": 0}, "timeouts"),
    ({"state_buffers_per_param": -1}, "state_buffers_per_param"),
])
def test_job_config_refuses_bad_values_naming_the_field(kwargs: dict[str, object],
                                                        message: str) -> None:
    from runtime.errors import ConfigError
    from runtime.job import JobConfig

    with pytest.raises(ConfigError, match=message):
        JobConfig(**kwargs)  # type: ignore[arg-type]
