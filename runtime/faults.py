"""Fault injection for tests and demos: ``ACTION[:key=value...]`` specifications.

Actions (``rank`` is the data-parallel rank, ``step`` the 0-based step index):

* ``kill:rank=K:step=T`` — worker K SIGKILLs itself mid-step T (its gradient allreduce
  already launched, so its peers are inside the collective);
* ``raise:rank=K:step=T`` — worker K's collective of step T raises;
* ``warn:rank=K:step=T[:signal=CAUSE]`` — a telemetry warning (default ``ecc_rising``)
  for worker K is injected through the signal file at step T;
* ``drain:rank=K:step=T`` — a drain request for worker K is filed at step T;
* ``killall:step=T`` — every worker SIGKILLs itself at the start of step T.

Each fault fires once per job, even though a replacement re-executes the same step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from runtime import protocol as P
from runtime.errors import FaultSpecError

ACTIONS = ("kill", "raise", "warn", "drain", "killall")
SIGNAL_CAUSES = ("ecc_rising", "ecc_uncorrectable", "row_remap_pending", "thermal", "xid")


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultSpec:
    """One injected fault."""

    action: str
    step: int
    rank: int | None = None
    signal: str = "ecc_rising"

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise FaultSpecError(f"fault action must be one of {ACTIONS}, got {self.action!r}")
        if self.step < 0:
            raise FaultSpecError("fault step must be >= 0")
        if self.action == "killall":
            if self.rank is not None:
                raise FaultSpecError("killall takes no rank")
        elif self.rank is None or self.rank < 0:
            raise FaultSpecError(f"{self.action} needs rank=K (K >= 0)")
        if self.signal not in SIGNAL_CAUSES:
            raise FaultSpecError(f"signal must be one of {SIGNAL_CAUSES}")

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able dict (how faults travel to workers in the environment)."""
        return asdict(self)


def parse_fault(text: str) -> FaultSpec:
    """Parse ``ACTION:key=value:...``; raise :class:`FaultSpecError` on bad input."""
    action, *parts = text.strip().split(":")
    kv: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in ("rank", "step", "signal"):
            raise FaultSpecError(f"bad fault field {part!r} in {text!r}")
        kv[key] = value
    if "step" not in kv:
        raise FaultSpecError(f"fault {text!r} needs step=T")
    try:
        return FaultSpec(action=action, step=int(kv["step"]),
                         rank=int(kv["rank"]) if "rank" in kv else None,
                         signal=kv.get("signal", "ecc_rising"))
    except ValueError as exc:
        if isinstance(exc, FaultSpecError):
            raise
        raise FaultSpecError(f"bad number in fault {text!r}") from exc


def encode_faults(faults: list[FaultSpec]) -> str:
    """Serialise faults for the ``YOCO_FAULTS`` environment variable."""
    return json.dumps([f.to_json() for f in faults])


def decode_faults(text: str | None) -> list[FaultSpec]:
    """Inverse of :func:`encode_faults` (empty list for None or empty)."""
    if not text:
        return []
    return [FaultSpec(**d) for d in json.loads(text)]


class _Store(Protocol):
    def set(self, key: str, value: str) -> None: ...
    def add(self, key: str, value: int) -> int: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...


class FaultInjector:
    """Fires a worker's injected faults at their step, each once per job (the store
    arbitrates: a replacement re-executing the same step does not fire it again)."""

    def __init__(self, faults: list[FaultSpec], *, store: _Store, slot: str,
                 signal_file: str | None, control_dir: str | None) -> None:
        self.faults = faults
        self._store = store
        self._slot = slot
        self._signal_file = signal_file
        self._control_dir = control_dir

    def at_step_start(self, *, step: int, rank: int, gen: int) -> None:
        """Fire the faults that act at the start of ``step`` (killall, warn, drain)."""
        for fault in self.faults:
            if fault.step != step:
                continue
            if fault.action == "killall" and self._killall_armed(fault, gen):
                os.kill(os.getpid(), signal.SIGKILL)
            if fault.rank == rank and fault.action in ("warn", "drain") and self._fire(fault):
                self._inject_request(fault, step)

    def in_collective(self, *, step: int, rank: int) -> bool:
        """Fire the faults that act with the step's allreduce launched: ``kill`` does not
        return; True when an injected ``raise`` is due (the caller fails its collective)."""
        for fault in self.faults:
            if fault.step == step and fault.rank == rank:
                if fault.action == "kill" and self._fire(fault):
                    self._store.set(P.KEY_KILLED_AT, repr(time.time()))  # for the benchmark
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault.action == "raise" and self._fire(fault):
                    return True
        return False

    def _killall_armed(self, fault: FaultSpec, gen: int) -> bool:
        # The first rank to reach the step arms it for its generation; every rank of that
        # generation dies, and nobody after the recovery (a later generation) does.
        armed = self._store.compare_set(P.killall_key(fault.step), "", str(gen))
        return bool(armed.decode() == str(gen))

    def _fire(self, fault: FaultSpec) -> bool:
        return int(self._store.add(P.fired_key(fault.action, fault.step, fault.rank), 1)) == 1

    def _inject_request(self, fault: FaultSpec, step: int) -> None:
        line: dict[str, Any] = {"worker": self._slot, "t": time.time()}
        if fault.action == "warn" and self._signal_file:
            line |= {"cause": fault.signal, "detail": f"injected at step {step}"}
            with open(self._signal_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        elif fault.action == "drain" and self._control_dir:
            from runtime.control import file_drain_request

            file_drain_request(Path(self._control_dir), self._slot,
                               reason=f"injected at step {step}")
