"""deploy/: the Kubernetes manifests are valid Kubernetes objects (the official OpenAPI
schemas, strict: no unknown field, shipped by kubernetes-validate, offline), and the
agents of the multi-node manifests and of the Slurm batch script derive the right
identity from what Kubernetes and Slurm set."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from runtime.identity import NodeFlags, Source, parse_nnodes, resolve_identity

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if "grafana" not in p.parts)
# The oldest Kubernetes the manifests support (backoffLimitPerIndex is GA from 1.33)
# and the newest schema kubernetes-validate ships.
VERSIONS = ("1.33", kubernetes_validate.latest_version())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_are_valid_kubernetes_objects(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_broken_manifest() -> None:
    job = _docs(DEPLOY / "kubernetes" / "yoco-train.yaml")[1]
    job["spec"]["completionMode"] = 5  # wrong type
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)
    job = _docs(DEPLOY / "kubernetes" / "yoco-train.yaml")[1]
    job["spec"]["template"]["spec"]["subdomian"] = "typo"  # unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def test_every_pod_of_the_indexed_job_knows_its_node() -> None:
    service, job = _docs(DEPLOY / "kubernetes" / "yoco-train.yaml")
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    container = pod["containers"][0]
    env = _env(container)
    nnodes, spares = parse_nnodes(env["YOCO_NNODES"])
    assert spec["completions"] == spec["parallelism"] == nnodes + spares
    # The pods resolve as JOBNAME-K.SERVICE: the service selects the Job's pods, is the
    # pods' subdomain, and the agents are told its name.
    assert pod["subdomain"] == service["metadata"]["name"] == env["YOCO_K8S_SERVICE"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    port = service["spec"]["ports"][0]["port"]
    assert container["args"][:2] == ["yoco", "run"]
    ranks = []
    for index in range(spec["completions"]):
        hostname = f"{job['metadata']['name']}-{index}"  # what Kubernetes names the pod
        ident = resolve_identity(NodeFlags(), env | {"JOB_COMPLETION_INDEX": str(index)},
                                 hostname)
        assert ident.source == Source.KUBERNETES
        assert (ident.rdzv_host, ident.rdzv_port) == (
            f"{job['metadata']['name']}-0.{service['metadata']['name']}", port)
        ranks.append((ident.node_rank, ident.is_spare))
    assert ranks == [(k, k >= nnodes) for k in range(nnodes + spares)]


def test_the_slurm_script_starts_one_agent_per_node_with_its_identity(tmp_path: Path) -> None:
    script = DEPLOY / "slurm" / "yoco.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)=?(\S*)", text, re.M))
    assert directives["ntasks-per-node"] == "1"  # one agent per node
    train = int(re.search(r"TRAIN_NODES=\$\{TRAIN_NODES:-(\d+)\}", text).group(1))  # type: ignore[union-attr]
    spare = int(re.search(r"SPARE_NODES=\$\{SPARE_NODES:-(\d+)\}", text).group(1))  # type: ignore[union-attr]
    assert int(directives["nodes"]) == train + spare
    # Run it with a stand-in srun that records what it was asked to run.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"
    fake.write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {tmp_path}/srun.args\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    slurm = {"SLURM_JOB_ID": "81234", "SLURM_JOB_NUM_NODES": str(train + spare),
             "SLURM_NNODES": str(train + spare), "SLURM_JOB_NODELIST": "gpu[01-05]"}
    env = {**os.environ, **slurm, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "CONTRACT": "C-ACME-1"}
    subprocess.run(["bash", str(script), "train.py", "--steps", "10"], env=env, check=True)
    argv = (tmp_path / "srun.args").read_text().splitlines()
    assert "--no-kill" in argv and "--kill-on-bad-exit=0" in argv
    cmd = argv[argv.index("yoco"):]
    assert cmd[:2] == ["yoco", "run"] and cmd[-3:] == ["train.py", "--steps", "10"]
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=False))
    assert flags["--job-id"] == "slurm-81234" and flags["--contract"] == "C-ACME-1"
    # What each node's agent derives from that command line and its task's variables.
    for node in range(train + spare):
        task = slurm | {"SLURM_NODEID": str(node), "SLURM_PROCID": str(node),
                        "SLURMD_NODENAME": f"gpu0{node + 1}"}
        ident = resolve_identity(NodeFlags(nnodes=flags["--nnodes"]), task, "ignored")
        assert (ident.node_rank, ident.nnodes, ident.spare_nodes) == (node, train, spare)
        assert (ident.rdzv_host, ident.node_name) == ("gpu01", f"gpu0{node + 1}")
    # A wrong allocation is refused before anything starts.
    bad = env | {"SLURM_JOB_NUM_NODES": "3"}
    proc = subprocess.run(["bash", str(script), "train.py"], env=bad, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "3 nodes allocated" in proc.stderr, shlex.join(argv)


def test_the_gpu_check_command_is_ready() -> None:
    """The GPU checks stay one command (scripts/gpu-check runs the `gpu` tests, which ordinary
    runs deselect: tests/conftest.py)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"
    assert script.is_file() and os.access(script, os.X_OK)
    text = script.read_text()
    assert "-m gpu" in text and "YOCO_GPU_CHECK=1" in text
