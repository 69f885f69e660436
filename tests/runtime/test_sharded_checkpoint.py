"""Sharded checkpoints in the ``torch.distributed.checkpoint`` format
(runtime/sharded_checkpoint.py), written by real processes -- each one shard of an FSDP2
model, writing apart, no process group -- and one of them SIGKILLed half-way through its
write. The end-to-end rollbacks under ``yoco run --shards`` are in test_hsdp.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from runtime.errors import CheckpointError
from runtime.sharded_checkpoint import (
    _merge,
    checkpoint_name,
    latest_sharded_checkpoint,
    read_sharded_checkpoint,
)
from tests.runtime.test_migration import ROOT

pytestmark = pytest.mark.slow

WORKER = str(Path(__file__).with_name("dcp_shard_worker.py"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YOCO_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _write(directory: Path, shard: int, steps: int, *, attempt: int = 0,
           out: Path | None = None) -> str:
    cmd = [sys.executable, WORKER, "--dir", str(directory), "--shard", str(shard),
           "--steps", str(steps), "--attempt", str(attempt)]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt_train  # type: ignore[import-not-found]

    ap = gpt_train.argparse.ArgumentParser()
    gpt_train.add_model_args(ap)
    args = ap.parse_args(["--seq", "16", "--dim", "32", "--layers", "2", "--heads", "2",
                          "--text-chars", "2000"])
    _, vocab = gpt_train.make_data(args)
    model = gpt_train.build_model(args, vocab)
    return model, gpt_train.make_optimizer(model, args)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any], list[str]]:
    """Shards 0 then 1 of the checkpoint of step 3, each by its own process."""
    tmp = tmp_path_factory.mktemp("dcp")
    said = [_write(tmp / "ckpt", k, 3, out=tmp / f"local{k}.pt") for k in (0, 1)]
    return tmp / "ckpt", [torch.load(tmp / f"local{k}.pt") for k in (0, 1)], said


def test_shards_written_apart_make_one_dcp_checkpoint_loadable_unsharded(
        written: tuple[Path, list[Any], list[str]]) -> None:
    ckpts, local, said = written
    final = ckpts / checkpoint_name(3)
    # Shard 0 wrote its part and left; shard 1 found both parts and finalized.
    assert said == ["final None", f"final {final}"]
    assert latest_sharded_checkpoint(ckpts) == (3, final)
    assert sorted(p.name for p in ckpts.iterdir()) == [final.name]
    # An ordinary DCP checkpoint: DCP's reader sees every tensor whole.
    md = dcp.FileSystemReader(final).read_metadata()
    assert md.state_dict_metadata["model.wte.weight"].size == torch.Size([28, 32])
    # Read into one unsharded process: each tensor is the two shards gathered.
    model, opt = _tiny()
    state = read_sharded_checkpoint(final, model, opt)
    assert state["step"] == 3 and state["sampler"] == {"epoch": 0, "position": 24}
    assert state["scheduler"] == local[0]["scheduler"]
    for k, v in state["model"].items():
        assert torch.equal(v, torch.cat([part["model"][k] for part in local])), k
    want = local[0]["optimizer"]
    assert state["optimizer"]["param_groups"] == want["param_groups"]
    assert list(state["optimizer"]["state"]) == list(want["state"])
    for i, entry in want["state"].items():
        got = state["optimizer"]["state"][i]
        assert list(got) == list(entry)  # the same order as saved
        for n, v in entry.items():
            full = v if v.dim() == 0 else torch.cat([p["optimizer"]["state"][i][n]
                                                     for p in local])
            assert torch.equal(got[n], full), (i, n)
    # And it installs: the optimizer takes the state as saved.
    opt.load_state_dict(state["optimizer"])


def test_a_writer_killed_mid_write_leaves_no_checkpoint_that_loads(
        written: tuple[Path, list[Any], list[str]], tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpt"
    shutil.copytree(written[0], ckpts)
    assert _write(ckpts, 0, 6) == "final None"
    marker = tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, WORKER, "--dir", str(ckpts), "--shard", "1",
                             "--steps", "6", "--hang-in-write", str(marker)], env=_env())
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "never wrote"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    torn = ckpts / f".{checkpoint_name(6)}.g0.tmp"
    # Shard 1's data is on disk, its metadata is not: no checkpoint of step 6.
    assert (torn / "__1_0.distcp").exists() and (torn / "__0.metadata").exists()
    assert not (torn / "__1.metadata").exists() and not (torn / ".metadata").exists()
    assert latest_sharded_checkpoint(ckpts) == (3, ckpts / checkpoint_name(3))
    model, opt = _tiny()
    with pytest.raises(CheckpointError, match="no readable global metadata"):
        read_sharded_checkpoint(torn, model, opt)
    # The step written again (a later generation): whole; the torn attempt is removed.
    assert _write(ckpts, 0, 6, attempt=1) == "final None"
    assert _write(ckpts, 1, 6, attempt=1) == f"final {ckpts / checkpoint_name(6)}"
    assert sorted(p.name for p in ckpts.iterdir()) == [checkpoint_name(3), checkpoint_name(6)]
    assert read_sharded_checkpoint(ckpts / checkpoint_name(6), model, opt)["step"] == 6


def test_a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing(
        written: tuple[Path, list[Any], list[str]], tmp_path: Path) -> None:
    final = written[0] / checkpoint_name(3)
    model, opt = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="no readable global metadata"):
        read_sharded_checkpoint(tmp_path / "nothing", model, opt)
    # Another model (wider): the first mismatching entry is named.
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt_train

    wide = gpt_train.GPT(28, 16, 48, 2, 2)
    with pytest.raises(CheckpointError, match=r"model\.\S+ has shape"):
        read_sharded_checkpoint(final, wide, torch.optim.AdamW(wide.parameters()))
    # Fewer layers: the checkpoint has entries the model lacks.
    short = gpt_train.GPT(28, 16, 32, 1, 2)
    with pytest.raises(CheckpointError, match="the model has not"):
        read_sharded_checkpoint(final, short, torch.optim.AdamW(short.parameters()))
    # Damaged metadata.
    broken = tmp_path / "broken"
    shutil.copytree(final, broken)
    (broken / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="no readable global metadata"):
        read_sharded_checkpoint(broken, model, opt)
    # A data file cut short.
    data = broken / "__1_0.distcp"
    shutil.copy(final / ".metadata", broken / ".metadata")
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cannot load checkpoint"):
        read_sharded_checkpoint(broken, model, opt)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_one_shards_metadata_alone_is_not_a_whole_checkpoint(
        written: tuple[Path, list[Any], list[str]]) -> None:
    # The rule the finalizer applies: every tensor's chunks cover it exactly.
    final = written[0] / checkpoint_name(3)
    part = dcp.FileSystemReader(final).read_metadata(rank=0)
    with pytest.raises(CheckpointError, match=r"the shards hold \d+ of the \d+ elements"):
        _merge([part], final)
    both = [dcp.FileSystemReader(final).read_metadata(rank=k) for k in (0, 1)]
    assert _merge(both, final).state_dict_metadata.keys() == \
        dcp.FileSystemReader(final).read_metadata().state_dict_metadata.keys()
