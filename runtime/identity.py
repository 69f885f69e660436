"""Which node this is: the node agent's identity, from ``yoco run`` flags or from what
Slurm or Kubernetes set in the environment. Pure functions, no I/O.

Every host runs the same command (like ``torchrun``); each agent needs its node rank,
how many nodes train (``nnodes``) and how many are spares, where the coordinator listens
(the rendezvous endpoint: the host of node rank 0), and the name records give the node.

Precedence, field by field: a flag of ``yoco run``, then ``YOCO_*`` variables (set by the
deploy manifests), then the scheduler's own variables:

* **Slurm** (``srun`` with one task per node): ``SLURM_NODEID`` (the node's index in the
  allocation; ``SLURM_PROCID`` when there is no node id), ``SLURM_JOB_NUM_NODES`` /
  ``SLURM_NNODES`` (all nodes: training nodes + spare nodes), ``SLURM_JOB_NODELIST``
  (compressed host list; its first host is the rendezvous host), ``SLURMD_NODENAME``.
* **Kubernetes** indexed Job (or a JobSet's job): ``JOB_COMPLETION_INDEX`` is the node
  rank; the pod's host name is ``JOBNAME-INDEX``, reachable as
  ``JOBNAME-INDEX.SERVICE`` through the headless service named by ``YOCO_K8S_SERVICE``
  (the pod's ``subdomain``), so the rendezvous host is ``JOBNAME-0.SERVICE``. Kubernetes
  sets no node count: the manifest sets ``YOCO_NNODES``.

The nodes ``0 .. nnodes-1`` train; ``nnodes .. nnodes+spares-1`` are spare nodes (their
agents start spare workers only). Node rank 0 also runs the coordinator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from runtime.errors import ConfigError

#: The rendezvous port when none is given (torchrun's default, too).
DEFAULT_RDZV_PORT = 29400

ENV_NNODES = "YOCO_NNODES"  # "N" or "N:+S"
ENV_NODE_RANK = "YOCO_NODE_RANK"
ENV_RDZV_ENDPOINT = "YOCO_RDZV_ENDPOINT"  # HOST[:PORT]
ENV_NODE_NAME = "YOCO_NODE_NAME"
ENV_K8S_SERVICE = "YOCO_K8S_SERVICE"  # the headless service (the pods' subdomain)


class Source(StrEnum):
    """Where the node rank came from."""

    FLAGS = "flags"
    ENV = "env"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


@dataclass(kw_only=True, slots=True, frozen=True)
class NodeFlags:
    """What ``yoco run`` was given on the command line (None: not given)."""

    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    node_name: str | None = None


@dataclass(kw_only=True, slots=True, frozen=True)
class NodeIdentity:
    """One node agent's identity."""

    node_rank: int
    nnodes: int
    spare_nodes: int
    rdzv_host: str
    rdzv_port: int
    node_name: str
    source: Source

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ConfigError("nnodes must be >= 1")
        if self.spare_nodes < 0:
            raise ConfigError("spare nodes must be >= 0")
        if not 0 <= self.node_rank < self.nnodes + self.spare_nodes:
            raise ConfigError(f"node rank {self.node_rank} is outside 0..."
                              f"{self.nnodes + self.spare_nodes - 1} (nnodes {self.nnodes} "
                              f"+ {self.spare_nodes} spare)")
        if not self.rdzv_host:
            raise ConfigError("the rendezvous host is empty")
        if not 0 < self.rdzv_port < 65536:
            raise ConfigError(f"rendezvous port {self.rdzv_port} is not in 1..65535")
        if not self.node_name:
            raise ConfigError("the node name is empty")

    @property
    def total_nodes(self) -> int:
        """Training nodes and spare nodes."""
        return self.nnodes + self.spare_nodes

    @property
    def is_coordinator(self) -> bool:
        """True on node rank 0, which also runs the coordinator."""
        return self.node_rank == 0

    @property
    def is_spare(self) -> bool:
        """True on a spare node (rank >= nnodes)."""
        return self.node_rank >= self.nnodes


def parse_nnodes(text: str, *, what: str = "--nnodes") -> tuple[int, int]:
    """Parse ``N`` or ``N:+S`` (N training nodes, S spare nodes)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*\+\s*(\d+)\s*)?", text)
    if not m:
        raise ConfigError(f"{what} must be N or N:+S (e.g. 4:+1), got {text!r}")
    n, s = int(m.group(1)), int(m.group(2) or 0)
    if n < 1:
        raise ConfigError(f"{what}: at least one training node, got {text!r}")
    return n, s


def parse_endpoint(text: str, *, what: str = "--rdzv-endpoint") -> tuple[str, int]:
    """Parse ``HOST[:PORT]`` (``[v6]:PORT`` for an IPv6 address); the port defaults to
    :data:`DEFAULT_RDZV_PORT`."""
    text = text.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", text)
    port: str | None
    if m:
        host, port = m.group(1), m.group(2)
    elif text.count(":") > 1:
        raise ConfigError(f"{what}: write an IPv6 address as [ADDR]:PORT, got {text!r}")
    else:
        host, colon, after = text.partition(":")
        if colon and not after:
            raise ConfigError(f"{what}: empty port in {text!r}")
        port = after if colon else None
    if not host or not re.fullmatch(r"[A-Za-z0-9_.:-]+", host):
        raise ConfigError(f"{what}: bad host in {text!r}")
    if port is not None and not port.isdigit():
        raise ConfigError(f"{what}: the port must be a number, got {text!r}")
    p = int(port) if port else DEFAULT_RDZV_PORT
    if not 0 < p < 65536:
        raise ConfigError(f"{what}: port {p} is not in 1..65535")
    return host, p


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list (``node[01-03,7],gpu-a1``) into host names, in order.

    Ranges keep their zero padding (``[08-10]`` is 08, 09, 10); several bracket groups in
    one name multiply out (``r[1-2]n[1-2]``).
    """
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        if not item:
            raise ConfigError(f"empty host in the host list {text!r}")
        hosts.extend(_expand_one(item, text))
    return hosts


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"unbalanced ']' in the host list {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ConfigError(f"unbalanced '[' in the host list {text!r}")
    parts.append(cur)
    return parts


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        if "]" in item:
            raise ConfigError(f"bad host {item!r} in the host list {whole!r}")
        return [item]
    prefix, ranges, rest = m.groups()
    out: list[str] = []
    for rng in ranges.split(","):
        lo, sep, hi = rng.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ConfigError(f"bad range {rng!r} in the host list {whole!r}")
        width = len(lo)
        start, end = int(lo), int(hi) if sep else int(lo)
        if end < start:
            raise ConfigError(f"descending range {rng!r} in the host list {whole!r}")
        if end - start > 100_000:
            raise ConfigError(f"range {rng!r} in the host list {whole!r} is too large")
        out.extend(f"{prefix}{i:0{width}d}" for i in range(start, end + 1))
    return [h + tail for h in out for tail in _expand_one(rest, whole)] if rest else out


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {raw!r}")
    return value


def detect_scheduler(env: Mapping[str, str]) -> Source | None:
    """The scheduler whose variables are present (Slurm first), or None."""
    if "SLURM_JOB_ID" in env and ("SLURM_NODEID" in env or "SLURM_PROCID" in env):
        return Source.SLURM
    if "JOB_COMPLETION_INDEX" in env:
        return Source.KUBERNETES
    return None


def resolve_identity(flags: NodeFlags, env: Mapping[str, str], hostname: str) -> NodeIdentity:
    """Derive this node's identity from ``flags``, then ``YOCO_*`` variables, then the
    scheduler's variables (see the module docstring). Raises :class:`ConfigError`
    naming the flag or variable that is missing or wrong."""
    sched = detect_scheduler(env)
    # Node rank.
    rank: int | None = flags.node_rank
    source = Source.FLAGS
    if rank is None and (rank := _int(env, ENV_NODE_RANK)) is not None:
        source = Source.ENV
    if rank is None and sched == Source.SLURM:
        rank = _int(env, "SLURM_NODEID")
        if rank is None:
            rank = _int(env, "SLURM_PROCID")
        source = Source.SLURM
    if rank is None and sched == Source.KUBERNETES:
        rank, source = _int(env, "JOB_COMPLETION_INDEX"), Source.KUBERNETES
    if rank is None:
        raise ConfigError("no node rank: give --node-rank, or set YOCO_NODE_RANK, or run "
                          "under Slurm (SLURM_NODEID) or a Kubernetes indexed Job "
                          "(JOB_COMPLETION_INDEX)")
    # Node counts.
    slurm_nodes = None
    if sched == Source.SLURM:
        slurm_nodes = _int(env, "SLURM_JOB_NUM_NODES")
        if slurm_nodes is None:
            slurm_nodes = _int(env, "SLURM_NNODES")
    if flags.nnodes is not None:
        nnodes, spares = parse_nnodes(flags.nnodes)
    elif env.get(ENV_NNODES):
        nnodes, spares = parse_nnodes(env[ENV_NNODES], what=ENV_NNODES)
    elif slurm_nodes is not None:
        nnodes, spares = slurm_nodes, 0
    else:
        raise ConfigError("no node count: give --nnodes N[:+S] or set YOCO_NNODES"
                          + (" (Kubernetes sets none)" if sched == Source.KUBERNETES else ""))
    if slurm_nodes is not None and slurm_nodes != nnodes + spares:
        raise ConfigError(f"Slurm allocated {slurm_nodes} nodes (SLURM_JOB_NUM_NODES) but "
                          f"--nnodes/YOCO_NNODES asks for {nnodes} + {spares} spare")
    # Node name.
    name = flags.node_name or env.get(ENV_NODE_NAME) or (
        env.get("SLURMD_NODENAME") if sched == Source.SLURM else None) or hostname
    # Rendezvous endpoint.
    endpoint = flags.rdzv_endpoint or env.get(ENV_RDZV_ENDPOINT)
    what = "--rdzv-endpoint" if flags.rdzv_endpoint else ENV_RDZV_ENDPOINT
    if endpoint:
        host, port = parse_endpoint(endpoint, what=what)
    elif sched == Source.SLURM and env.get("SLURM_JOB_NODELIST"):
        host, port = expand_hostlist(env["SLURM_JOB_NODELIST"])[0], DEFAULT_RDZV_PORT
    elif sched == Source.KUBERNETES and env.get(ENV_K8S_SERVICE):
        m = re.fullmatch(r"(.+)-(\d+)", hostname)
        if not m:
            raise ConfigError(f"the pod's host name {hostname!r} is not JOBNAME-INDEX "
                              "(an indexed Job with subdomain set): set YOCO_RDZV_ENDPOINT")
        host = f"{m.group(1)}-0.{env[ENV_K8S_SERVICE]}"
        port = DEFAULT_RDZV_PORT
    else:
        raise ConfigError("no rendezvous endpoint: give --rdzv-endpoint HOST:PORT or set "
                          "YOCO_RDZV_ENDPOINT (under Kubernetes, or YOCO_K8S_SERVICE)")
    return NodeIdentity(node_rank=rank, nnodes=nnodes, spare_nodes=spares, rdzv_host=host,
                        rdzv_port=port, node_name=name, source=source)
