"""A partition and freeze harness: test "hosts" in Linux network namespaces of their own.

What a second machine is to the runtime, made on one machine (root is needed; tests
and CI run as root):

* **Network.** A *switch* namespace holds a bridge; host K's namespace is joined to it by
  a veth pair: ``eth0`` with ``10.231.0.{K+1}/24`` inside the host, ``pK`` on the bridge
  in the switch. Those are the only addresses, and only in namespaces this harness made:
  nothing can leave the machine (the switch has no uplink, the root namespace is not on
  it). gloo is told to use ``eth0`` (``GLOO_SOCKET_IFNAME``).
* **Machine identity.** Each host's processes run in a private mount namespace where
  ``/etc/machine-id`` is a bind mount of a file of its own, so
  :func:`runtime.nodepool.machine_id` differs from host to host: the coordinator takes
  every other host as remote (:attr:`runtime.nodepool.Node.reachable` is False) and can
  neither read its ``/proc`` entries nor signal it, as with a real second machine.
* **Faults.** :meth:`Netns.freeze` / :meth:`Netns.thaw` SIGSTOP / SIGCONT every process
  in a host's network namespace (``ip netns pids``: whatever process groups or sessions
  they made); :meth:`Netns.cut` / :meth:`Netns.heal` take the host's switch port down /
  up (its TCP connections stay open and retransmit, as when a cable or a switch fails).
* **Cleanup.** Names carry the creating process's pid (``yoco<PID>x<N>...``);
  :meth:`Netns.close` kills every process in the namespaces and deletes them, and a new
  :class:`Netns` first removes those left by a process that no longer exists (a crashed
  test run).

:class:`NetnsCluster` runs ``yoco run --nnodes ...`` on such hosts (host 0 is the
coordinator's). Self-contained on purpose: only the standard library and the runtime's
public ``yoco run`` command line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.231.0"
#: The interface every host has, and gloo uses.
IFNAME = "eth0"
_NAME = re.compile(r"^yoco(\d+)x\d+")
_count = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_pids(ns: str, sig: int) -> list[int]:
    """Send ``sig`` to every process in network namespace ``ns``; return their pids."""
    found = _ip("netns", "pids", ns, check=False).stdout.split()
    pids = [int(p) for p in found if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def _state(pid: int) -> str:
    """A process's state letter in /proc ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _settle(pids: Sequence[int], *, stopped: bool, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [_state(p) for p in pids]
        if all((st in ("T", "t", "")) == stopped or st in ("", "Z", "X") for st in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"processes {list(pids)} not {'stopped' if stopped else 'running'} "
                         f"after {timeout:.0f} s")


def _remove(namespaces: Sequence[str]) -> None:
    for ns in namespaces:
        _signal_pids(ns, signal.SIGCONT)
        _signal_pids(ns, signal.SIGKILL)
    for ns in namespaces:
        deadline = time.monotonic() + 10
        while _ip("netns", "pids", ns, check=False).stdout.split() \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)


def remove_stale() -> None:
    """Delete the namespaces of this harness left by processes that no longer exist."""
    listed = _ip("netns", "list", check=False).stdout.splitlines()
    stale = []
    for line in listed:
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not pid_alive(int(m.group(1))):
            stale.append(name)
    _remove(stale)


class Netns:
    """``hosts`` hosts, each in a network namespace of its own, on one private switch
    (see the module docstring). Use as a context manager or call :meth:`close`."""

    def __init__(self, hosts: int, workdir: Path) -> None:
        if hosts < 1 or hosts > 200:
            raise ValueError(f"hosts must be in 1..200, not {hosts}")
        remove_stale()
        self.hosts = hosts
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.tag = f"yoco{os.getpid()}x{next(_count)}"
        self.switch = f"{self.tag}sw"
        self.names = [f"{self.tag}h{k}" for k in range(hosts)]
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for ns in (self.switch, *self.names):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for k, ns in enumerate(self.names):
            # Made inside the host's namespace (no interface ever exists in the root
            # namespace), its peer moved to the switch.
            _ip("-n", ns, "link", "add", IFNAME, "type", "veth", "peer", "name", f"p{k}")
            _ip("-n", ns, "link", "set", f"p{k}", "netns", self.switch)
            _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", IFNAME)
            _ip("-n", ns, "link", "set", IFNAME, "up")
            _ip("-n", self.switch, "link", "set", f"p{k}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{k}", "up")
            (self.workdir / f"machine-id.{k}").write_text(uuid.uuid4().hex + "\n")

    def address(self, k: int) -> str:
        """Host ``k``'s address (on its ``eth0``)."""
        return f"{SUBNET}.{k + 1}"

    def command(self, k: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on host ``k``: in its network namespace, with its machine id."""
        mid = str(self.workdir / f"machine-id.{k}")
        return ["ip", "netns", "exec", self.names[k], "unshare", "--mount",
                "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/machine-id && exec "$@"', mid, *argv]

    def popen(self, k: int, argv: Sequence[str], *, env: Mapping[str, str],
              log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host ``k`` (a session of its own), output appended to ``log``."""
        with log.open("ab") as out:
            return subprocess.Popen(self.command(k, argv), env={**env, "GLOO_SOCKET_IFNAME":
                                                                IFNAME},
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def run(self, k: int, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``k`` to its end; its output captured."""
        return subprocess.run(self.command(k, argv), capture_output=True, text=True,
                              timeout=60)

    def freeze(self, k: int) -> list[int]:
        """SIGSTOP every process of host ``k`` and wait until each is stopped (a signal
        is delivered asynchronously); return their pids."""
        pids = _signal_pids(self.names[k], signal.SIGSTOP)
        _settle(pids, stopped=True)
        return pids

    def thaw(self, k: int) -> list[int]:
        """SIGCONT every process of host ``k`` and wait until none is stopped; return
        their pids."""
        pids = _signal_pids(self.names[k], signal.SIGCONT)
        _settle(pids, stopped=False)
        return pids

    def cut(self, k: int) -> None:
        """Cut host ``k`` off the network (its switch port down)."""
        _ip("-n", self.switch, "link", "set", f"p{k}", "down")

    def heal(self, k: int) -> None:
        """Connect host ``k`` again (its switch port up)."""
        _ip("-n", self.switch, "link", "set", f"p{k}", "up")

    def pids(self, k: int) -> list[int]:
        """The processes running on host ``k``."""
        return [int(p) for p in _ip("netns", "pids", self.names[k], check=False).stdout.split()
                if p.isdigit()]

    def close(self) -> None:
        """Kill every process on the hosts and delete the namespaces (idempotent)."""
        made, self._made = self._made, []
        _remove(made)

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NetnsCluster:
    """``yoco run --nnodes NNODES`` on the hosts of a :class:`Netns` (host 0 runs the
    coordinator; its store on host 0's address), records in a JSONL sink file."""

    def __init__(self, net: Netns, tmp: Path, *, script: str, script_args: Sequence[str],
                 nnodes: str, nproc: int, job_id: str = "nn",
                 extra: Sequence[str] = (), port: int = 29400) -> None:
        n, _, s = nnodes.partition(":+")
        self.total = int(n) + int(s or 0)
        if self.total > net.hosts:
            raise ValueError(f"{nnodes} needs {self.total} hosts, the network has {net.hosts}")
        self.net = net
        self.tmp = tmp
        self.job_id = job_id
        self.sink = tmp / "records.jsonl"
        self.run_dir = tmp / "runs" / job_id
        self.args = ["--nnodes", nnodes, "--nproc-per-node", str(nproc),
                     "--rdzv-endpoint", f"{net.address(0)}:{port}", "--job-id", job_id,
                     "--runs-root", str(tmp / "runs"), "--sink", f"jsonl:{self.sink}",
                     "--no-nvml", *extra]
        self.script = [script, *script_args]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, k: int, *more: str) -> None:
        """Start host k's ``yoco run`` (``more``: options such as ``--resume``)."""
        argv = [sys.executable, "-m", "yoco.cli_runtime", "run", *self.args, *more,
                "--node-rank", str(k), "--node-name", f"host{k}", *self.script]
        self.procs[k] = self.net.popen(k, argv, env=self.env, log=self.tmp / f"host{k}.log")

    def start_all(self, *more: str) -> None:
        """Start every host."""
        for k in range(self.total):
            self.start(k, *more)

    def records(self) -> list[dict[str, Any]]:
        """What the sink has received (each line's JSON; a torn last line left out)."""
        if not self.sink.exists():
            return []
        out = []
        for line in self.sink.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def outbox(self) -> list[dict[str, Any]]:
        """The coordinator's outbox (every record written, delivered or not)."""
        path = self.run_dir / "outbox" / "records.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def status(self) -> dict[str, Any]:
        """The coordinator's ``status.json`` ({} before it exists or while rewritten)."""
        with contextlib.suppress(OSError, json.JSONDecodeError):
            return dict(json.loads((self.run_dir / "status.json").read_text()))
        return {}

    def wait_until(self, pred: Callable[[], bool], what: str, timeout: float = 240) -> None:
        """Wait until ``pred()`` holds; fail with every host's log after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; logs:\n{self.logs()}")

    def progress_at(self, step: int, timeout: float = 240) -> None:
        """Wait until rank 0 has reported step ``step`` (outbox progress records)."""
        def reached() -> bool:
            steps = [r.get("step", -1) for r in self.outbox() if r["kind"] == "job_progress"]
            return bool(steps) and max(steps) >= step
        self.wait_until(reached, f"step {step}", timeout)

    def wait(self, k: int, timeout: float = 240) -> int:
        """Host k's exit status."""
        try:
            return self.procs[k].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"host{k} did not end; logs:\n{self.logs()}") from None

    def log(self, k: int) -> str:
        """Host k's output so far."""
        path = self.tmp / f"host{k}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        """Every host's log (the tail of each), for failure messages."""
        return "\n".join(f"--- host{k}\n{self.log(k)[-4000:]}" for k in sorted(self.procs))

    def close(self) -> None:
        """Kill whatever is left of the job (the hosts' namespaces stay, see Netns)."""
        for k in self.procs:
            self.net.thaw(k)
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
