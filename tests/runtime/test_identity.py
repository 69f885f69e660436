"""The node agent's identity from flags, Slurm's and Kubernetes' variables (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import ConfigError
from runtime.identity import (
    DEFAULT_RDZV_PORT,
    NodeFlags,
    Source,
    expand_hostlist,
    parse_endpoint,
    parse_nnodes,
    resolve_identity,
)

# What `srun --nodes=4 --ntasks-per-node=1` sets on the third node (a real allocation's
# variable set, trimmed to those Slurm documents for the task environment).
SLURM = {
    "SLURM_JOB_ID": "81234", "SLURM_JOB_NAME": "yoco", "SLURM_NODEID": "2",
    "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NNODES": "4",
    "SLURM_JOB_NUM_NODES": "4", "SLURM_NTASKS": "4",
    "SLURM_JOB_NODELIST": "gpu-a[07-08,10],gpu-b01", "SLURM_NODELIST": "gpu-a[07-08,10],gpu-b01",
    "SLURMD_NODENAME": "gpu-a10", "SLURM_TASKS_PER_NODE": "1(x4)",
}

# What the indexed Job of deploy/kubernetes/yoco-train.yaml gives pod 1.
K8S = {"JOB_COMPLETION_INDEX": "1", "YOCO_NNODES": "3:+1", "YOCO_K8S_SERVICE": "yoco-train",
       "HOSTNAME": "yoco-train-1"}


def test_flags_alone() -> None:
    ident = resolve_identity(NodeFlags(nnodes="3:+1", node_rank=3,
                                       rdzv_endpoint="127.0.0.2:29500", node_name="h3"),
                             {}, "vm")
    assert (ident.node_rank, ident.nnodes, ident.spare_nodes) == (3, 3, 1)
    assert (ident.rdzv_host, ident.rdzv_port, ident.node_name) == ("127.0.0.2", 29500, "h3")
    assert ident.is_spare and not ident.is_coordinator and ident.total_nodes == 4
    assert ident.source == Source.FLAGS


def test_slurm() -> None:
    ident = resolve_identity(NodeFlags(), SLURM, "ignored")
    assert (ident.node_rank, ident.nnodes, ident.spare_nodes) == (2, 4, 0)
    assert (ident.rdzv_host, ident.rdzv_port) == ("gpu-a07", DEFAULT_RDZV_PORT)
    assert ident.node_name == "gpu-a10" and ident.source == Source.SLURM
    # --nnodes N:+S splits Slurm's allocation into training and spare nodes.
    ident = resolve_identity(NodeFlags(nnodes="3:+1"), SLURM, "x")
    assert (ident.nnodes, ident.spare_nodes) == (3, 1)
    # Without SLURM_NODEID (a step launched differently), the task rank.
    env = {k: v for k, v in SLURM.items() if k != "SLURM_NODEID"} | {"SLURM_PROCID": "1"}
    assert resolve_identity(NodeFlags(), env, "x").node_rank == 1
    # Flags win over Slurm's variables.
    ident = resolve_identity(NodeFlags(node_rank=0, rdzv_endpoint="head:1234"), SLURM, "x")
    assert (ident.node_rank, ident.rdzv_host, ident.rdzv_port) == (0, "head", 1234)


def test_slurm_allocation_must_match_nnodes() -> None:
    with pytest.raises(ConfigError, match="SLURM_JOB_NUM_NODES"):
        resolve_identity(NodeFlags(nnodes="4:+1"), SLURM, "x")


def test_kubernetes_indexed_job() -> None:
    ident = resolve_identity(NodeFlags(), K8S, "yoco-train-1")
    assert (ident.node_rank, ident.nnodes, ident.spare_nodes) == (1, 3, 1)
    assert (ident.rdzv_host, ident.rdzv_port) == ("yoco-train-0.yoco-train", DEFAULT_RDZV_PORT)
    assert ident.node_name == "yoco-train-1" and ident.source == Source.KUBERNETES
    # The spare pod (index 3) is a spare node.
    spare = resolve_identity(NodeFlags(), K8S | {"JOB_COMPLETION_INDEX": "3"}, "yoco-train-3")
    assert spare.is_spare
    # An explicit endpoint (e.g. a JobSet's own naming) wins.
    ident = resolve_identity(NodeFlags(), K8S | {"YOCO_RDZV_ENDPOINT": "js-w-0-0.js:29401"},
                             "js-w-0-1")
    assert (ident.rdzv_host, ident.rdzv_port) == ("js-w-0-0.js", 29401)


@pytest.mark.parametrize(("env", "flags", "message"), [
    ({}, NodeFlags(nnodes="2", rdzv_endpoint="h:1"), "no node rank"),
    ({"JOB_COMPLETION_INDEX": "0", "YOCO_K8S_SERVICE": "s"}, NodeFlags(), "Kubernetes sets none"),
    (K8S | {"JOB_COMPLETION_INDEX": "4", "YOCO_RDZV_ENDPOINT": "h"}, NodeFlags(),
     "outside 0...3"),
    (K8S | {"JOB_COMPLETION_INDEX": "x"}, NodeFlags(), "JOB_COMPLETION_INDEX must be an integer"),
    (K8S | {"YOCO_NNODES": "three"}, NodeFlags(), "YOCO_NNODES must be N or N:\\+S"),
    ({"YOCO_NODE_RANK": "-1"}, NodeFlags(), "YOCO_NODE_RANK must be >= 0"),
    ({"JOB_COMPLETION_INDEX": "0", "YOCO_NNODES": "2"}, NodeFlags(), "no rendezvous endpoint"),
    (SLURM | {"SLURM_JOB_NODELIST": "gpu[1-"}, NodeFlags(), "unbalanced"),
    ({}, NodeFlags(node_rank=0, nnodes="1", rdzv_endpoint="h:0"), "port 0"),
    ({}, NodeFlags(node_rank=0, nnodes="0", rdzv_endpoint="h"), "at least one"),
])
def test_bad_input_names_the_flag_or_variable(env: dict[str, str], flags: NodeFlags,
                                               message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_identity(flags, env, "pod")


def test_kubernetes_host_name_must_carry_the_index() -> None:
    with pytest.raises(ConfigError, match="JOBNAME-INDEX"):
        resolve_identity(NodeFlags(), K8S, "some-pod")


def test_hostlists() -> None:
    assert expand_hostlist("node1") == ["node1"]
    assert expand_hostlist("n[1-3]") == ["n1", "n2", "n3"]
    assert expand_hostlist("gpu-a[08-10],gpu-b01") == ["gpu-a08", "gpu-a09", "gpu-a10", "gpu-b01"]
    assert expand_hostlist("r[1-2]n[1,3]") == ["r1n1", "r1n3", "r2n1", "r2n3"]
    assert expand_hostlist("a[1,3-4],b") == ["a1", "a3", "a4", "b"]
    for bad in ("a[3-1]", "a[x]", "a[1-]", "a]", "a[1", "a,,b", "a[1-200000]"):
        with pytest.raises(ConfigError):
            expand_hostlist(bad)


@given(st.lists(st.integers(0, 999), min_size=1, max_size=20, unique=True))
def test_hostlist_ranges_round_trip(ids: list[int]) -> None:
    ids = sorted(ids)
    text = "h[" + ",".join(f"{i:03d}" for i in ids) + "]"
    assert expand_hostlist(text) == [f"h{i:03d}" for i in ids]


def test_endpoints_and_counts() -> None:
    assert parse_endpoint("host") == ("host", DEFAULT_RDZV_PORT)
    assert parse_endpoint("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_endpoint("[::1]:7") == ("::1", 7)
    for bad in ("::1", "h:", "h:x", "h:70000", ":5", "a b:1"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad)
    assert parse_nnodes("4") == (4, 0)
    assert parse_nnodes("4:+2") == (4, 2)
    for bad in ("4:2", "4+2", "-1", "", "0:+1"):
        with pytest.raises(ConfigError):
            parse_nnodes(bad)
