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
from dataclasses import asdict, dataclass
from typing import Any

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
