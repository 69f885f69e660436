"""Fault injection for tests and demos: ``ACTION[:key=value...]`` specifications.

Actions (``rank`` is the data-parallel rank, ``step`` the 0-based step index):

* ``kill:rank=K:step=T[:phase=P][:micro=M]`` — worker K SIGKILLs itself in phase P of
  step T: ``reduce`` (the default: its gradient allreduce already launched, so its peers
  are inside the collective), ``forward`` (at the start of the forward pass of micro-batch
  M, default 0, of the step: with gradient accumulation, M > 0 is mid-accumulation),
  ``backward`` (when the first gradient of micro-batch M's backward pass has been
  accumulated), ``optimizer`` (right after its own ``optimizer.step()`` applied the
  update, before the step is counted as committed) or ``checkpoint`` (rank K's
  checkpoint writer, half-way through writing the checkpoint of committed step T: the
  file is written but neither renamed nor published);
* ``raise:rank=K:step=T`` — worker K's collective of step T raises;
* ``warn:rank=K:step=T[:signal=CAUSE]`` — a telemetry warning (default ``ecc_rising``)
  for worker K is injected through the signal file at step T;
* ``drain:rank=K:step=T`` — a drain request for worker K is filed at step T;
* ``killall:step=T`` — every worker SIGKILLs itself at the start of step T;
* ``slow:rank=K:step=T[:seconds=S]`` — worker K sleeps S seconds (default 3) at the start
  of step T: a merely slow step (its peers wait for it in the allreduce), which the hang
  watchdog must not take for a hang;
* ``linger:rank=K:step=T[:seconds=S]`` — worker K, its loop ended at step T (the job's
  last), waits S seconds (default 3) before marking itself finished: a slow teardown on
  a loaded host, so that its peers finish first (the end-of-job barrier's test);
* ``lag:rank=K:step=0[:seconds=S]`` — the spare called in to take rank K, in the new
  generation's group, waits S seconds (default 3) before it receives the state, its
  donors waiting for it in the transfer; it first prints a line starting
  ``[yoco-fault] lag:`` to its log (a test freezes or cuts off its host then: a receiver
  lost in the middle of a recovery). ``step`` must be 0: a spare has no step before it
  has received one.

Each fault fires once per job, even though a replacement re-executes the same step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runtime import protocol as P
from runtime.errors import FaultSpecError

if TYPE_CHECKING:  # parsing fault specs (yoco run) does not import torch
    import torch

ACTIONS = ("kill", "raise", "warn", "drain", "killall", "linger", "slow", "lag")
#: Where in a step a ``kill`` fires (see the module docstring).
PHASES = ("forward", "backward", "reduce", "optimizer", "checkpoint")
SIGNAL_CAUSES = ("ecc_rising", "ecc_uncorrectable", "row_remap_pending", "thermal", "xid")


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultSpec:
    """One injected fault."""

    action: str
    step: int
    rank: int | None = None
    signal: str = "ecc_rising"
    phase: str = "reduce"
    micro: int = 0
    seconds: float = 3.0

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
        if not 0 <= self.seconds <= 3600:
            raise FaultSpecError("fault seconds must be in [0, 3600]")
        if self.signal not in SIGNAL_CAUSES:
            raise FaultSpecError(f"signal must be one of {SIGNAL_CAUSES}")
        if self.phase not in PHASES:
            raise FaultSpecError(f"phase must be one of {PHASES}, got {self.phase!r}")
        if (self.phase != "reduce" or self.micro) and self.action != "kill":
            raise FaultSpecError("phase and micro apply to kill only")
        if self.micro < 0:
            raise FaultSpecError("micro must be >= 0")
        if self.action == "lag" and self.step != 0:
            raise FaultSpecError("lag takes step=0: a spare has no step before it has "
                                 "received one")
        if self.micro and self.phase not in ("forward", "backward"):
            raise FaultSpecError("micro applies to the forward and backward phases only")

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able dict (how faults travel to workers in the environment)."""
        return asdict(self)


def parse_fault(text: str) -> FaultSpec:
    """Parse ``ACTION:key=value:...``; raise :class:`FaultSpecError` on bad input."""
    action, *parts = text.strip().split(":")
    kv: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in ("rank", "step", "signal", "phase", "micro", "seconds"):
            raise FaultSpecError(f"bad fault field {part!r} in {text!r}")
        kv[key] = value
    if "step" not in kv:
        raise FaultSpecError(f"fault {text!r} needs step=T")
    try:
        return FaultSpec(action=action, step=int(kv["step"]),
                         rank=int(kv["rank"]) if "rank" in kv else None,
                         signal=kv.get("signal", "ecc_rising"),
                         phase=kv.get("phase", "reduce"), micro=int(kv.get("micro", "0")),
                         seconds=float(kv.get("seconds", 3.0)))
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
        self._where: Callable[[], tuple[int, int]] = lambda: (-1, -1)
        self._forwards = 0  # forward passes begun in the current step (micro-batches)
        self._backward_hit = -1  # the micro-batch whose backward already checked faults

    def install(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                where: Callable[[], tuple[int, int]]) -> None:
        """Hook the phases a ``kill`` can name into ``model`` and ``optimizer``;
        ``where()`` returns this worker's (step, rank) now. Only the hooks some fault
        needs are installed: a job without phase faults runs no hook at all."""
        self._where = where
        phases = {f.phase for f in self.faults if f.action == "kill"}
        if phases & {"forward", "backward"}:
            model.register_forward_pre_hook(self._on_forward)
        if "backward" in phases:
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._on_grad)
        if "optimizer" in phases:
            optimizer.register_step_post_hook(self._on_optimizer_step)

    def _kill(self, fault: FaultSpec) -> None:
        if self._fire(fault):
            self._store.set(P.KEY_KILLED_AT, repr(time.time()))  # for the benchmark
            os.kill(os.getpid(), signal.SIGKILL)

    def _due(self, phase: str, step: int, rank: int, micro: int | None = None) -> list[FaultSpec]:
        return [f for f in self.faults if f.action == "kill" and f.phase == phase
                and f.step == step and f.rank == rank and (micro is None or f.micro == micro)]

    def _on_forward(self, _module: Any, _args: Any) -> None:
        micro = self._forwards
        self._forwards += 1
        step, rank = self._where()
        for fault in self._due("forward", step, rank, micro):
            self._kill(fault)

    def _on_grad(self, _param: Any) -> None:
        micro = self._forwards - 1  # the micro-batch whose backward is running
        if micro == self._backward_hit:
            return  # checked at this backward's first gradient already
        self._backward_hit = micro
        step, rank = self._where()
        for fault in self._due("backward", step, rank, micro):
            self._kill(fault)

    def _on_optimizer_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        step, rank = self._where()
        for fault in self._due("optimizer", step, rank):
            self._kill(fault)

    def during_checkpoint(self, *, step: int, rank: int) -> None:
        """Called by the checkpoint writer with the file written but not yet renamed or
        published: a ``kill`` at phase ``checkpoint`` of ``step`` fires here."""
        for fault in self._due("checkpoint", step, rank):
            self._kill(fault)

    def at_step_start(self, *, step: int, rank: int, gen: int) -> None:
        """Fire the faults that act at the start of ``step`` (killall, warn, drain,
        slow)."""
        self._forwards = 0
        self._backward_hit = -1
        for fault in self.faults:
            if fault.step != step:
                continue
            if fault.action == "killall" and self._killall_armed(fault, gen):
                os.kill(os.getpid(), signal.SIGKILL)
            if fault.rank == rank and fault.action in ("warn", "drain") and self._fire(fault):
                self._inject_request(fault, step)
            if fault.rank == rank and fault.action == "slow" and self._fire(fault):
                time.sleep(fault.seconds)

    def in_collective(self, *, step: int, rank: int) -> bool:
        """Fire the faults that act with the step's allreduce launched: ``kill`` does not
        return; True when an injected ``raise`` is due (the caller fails its collective)."""
        for fault in self._due("reduce", step, rank):
            self._kill(fault)
        for fault in self.faults:
            if fault.step == step and fault.rank == rank and fault.action == "raise" \
                    and self._fire(fault):
                return True
        return False

    def at_loop_end(self, *, step: int, rank: int) -> None:
        """Fire the faults that act when the training loop has ended (``linger``)."""
        for fault in self.faults:
            if fault.action == "linger" and fault.step == step and fault.rank == rank \
                    and self._fire(fault):
                time.sleep(fault.seconds)

    def before_receive(self, *, rank: int) -> None:
        """Called by a spare called in to take ``rank``, in the new group, before it
        receives the state: a ``lag`` for that rank fires here (once per job)."""
        for fault in self.faults:
            if fault.action == "lag" and fault.rank == rank and self._fire(fault):
                print(f"[yoco-fault] lag: {self._slot} waits {fault.seconds:g} s before "
                      f"receiving rank {rank}'s state", flush=True)
                time.sleep(fault.seconds)

    def _killall_armed(self, fault: FaultSpec, gen: int) -> bool:
        # The first rank to reach the step arms it for its generation; every rank of that
        # generation dies, and nobody after the recovery (a later generation) does.
        armed = self._store.compare_set(P.killall_key(fault.step), "", str(gen))
        return bool(armed.decode() == str(gen))

    def _fire(self, fault: FaultSpec) -> bool:
        action = fault.action if fault.phase == "reduce" else \
            f"{fault.action}.{fault.phase}.{fault.micro}"
        return int(self._store.add(P.fired_key(action, fault.step, fault.rank), 1)) == 1

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
