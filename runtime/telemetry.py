"""Early-warning telemetry: sources of device signals and the policy that reads them.

A source returns :class:`Reading` objects (raw metrics such as a corrected-ECC counter)
or ready-made :class:`Signal` objects (an injected "move off worker w1, cause
ecc_rising"). :class:`WarningPolicy` turns readings into signals. The supervisor polls
every source and moves the job off any worker that has a signal.

:class:`NvmlSource` reads NVML through ``nvidia-ml-py`` on a GPU machine; where there is
no GPU, ``nvmlInit`` raises and the source says so once and stays silent, so the other
sources (an injected file, a command) carry on.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runtime.errors import ConfigError

log = logging.getLogger("yoco.runtime.telemetry")

# XIDs that announce a dying GPU (memory page faults, ECC page retirement, row remap
# failure, fell off the bus, contained/uncontained ECC).
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass(kw_only=True, slots=True, frozen=True)
class Signal:
    """A reason to move the job off ``worker`` (a worker name) or ``gpu`` (an index)."""

    cause: str
    worker: str | None = None
    gpu: int | None = None
    detail: str = ""


@dataclass(kw_only=True, slots=True, frozen=True)
class Reading:
    """One metric sample of device ``gpu`` (or of ``worker``)."""

    metric: str  # ecc_corrected | ecc_uncorrected | remap_pending | retired_pending |
    #              temperature_c | xid
    value: float
    gpu: int | None = None
    worker: str | None = None
    slowdown_c: float | None = None


class TelemetrySource(Protocol):
    """Anything that can be polled for readings and signals."""

    def poll(self) -> list[Reading | Signal]:
        """Return what was observed since the previous poll (never raises)."""
        ...


@dataclass(kw_only=True, slots=True)
class WarningPolicy:
    """Thresholds that turn readings into pre-emptive migration signals."""

    corrected_ecc_delta: int = 100  # new corrected errors between two polls
    thermal_margin_c: float = 5.0  # move when within this of the slowdown threshold
    critical_xids: frozenset[int] = CRITICAL_XIDS
    _last_corrected: dict[tuple[int | None, str | None], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.corrected_ecc_delta < 1:
            raise ConfigError("corrected_ecc_delta must be >= 1")
        if self.thermal_margin_c < 0:
            raise ConfigError("thermal_margin_c must be >= 0")

    def evaluate(self, readings: Iterable[Reading]) -> list[Signal]:
        """Return the signals that ``readings`` cross."""
        out: list[Signal] = []
        for r in readings:
            if r.metric == "ecc_corrected":
                key = (r.gpu, r.worker)
                prev = self._last_corrected.get(key)
                self._last_corrected[key] = r.value
                if prev is not None and r.value - prev >= self.corrected_ecc_delta:
                    out.append(Signal(cause="ecc_rising", detail=f"corrected ECC +"
                                      f"{int(r.value - prev)}", gpu=r.gpu, worker=r.worker))
            elif r.metric == "ecc_uncorrected" and r.value > 0:
                out.append(Signal(cause="ecc_uncorrectable",
                                  detail=f"{int(r.value)} uncorrectable ECC errors",
                                  gpu=r.gpu, worker=r.worker))
            elif r.metric in ("remap_pending", "retired_pending") and r.value > 0:
                out.append(Signal(cause="row_remap_pending", detail=r.metric,
                                  gpu=r.gpu, worker=r.worker))
            elif r.metric == "temperature_c" and r.slowdown_c is not None \
                    and r.value >= r.slowdown_c - self.thermal_margin_c:
                out.append(Signal(cause="thermal", detail=f"{r.value:.0f}C, slowdown at "
                                  f"{r.slowdown_c:.0f}C", gpu=r.gpu, worker=r.worker))
            elif r.metric == "xid" and int(r.value) in self.critical_xids:
                out.append(Signal(cause="xid", detail=f"XID {int(r.value)}",
                                  gpu=r.gpu, worker=r.worker))
        return out


def _parse_line(line: str) -> Reading | Signal | None:
    """Parse one telemetry line; a malformed one is logged and skipped, never raised."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        log.warning("ignoring malformed telemetry line: %r", line[:200])
        return None
    if not isinstance(data, dict):
        log.warning("ignoring telemetry line that is not a JSON object: %r", line[:200])
        return None
    gpu = data.get("gpu")
    worker = data.get("worker")
    if (gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0)) \
            or (worker is not None and not isinstance(worker, str)):
        log.warning("ignoring telemetry line: 'gpu' must be an index >= 0 and 'worker' a "
                    "worker name: %r", line[:200])
        return None
    try:
        if "cause" in data:
            detail = data.get("detail")
            return Signal(cause=str(data["cause"]), worker=worker, gpu=gpu,
                          detail="" if detail is None else str(detail))
        if "metric" in data:
            slowdown = data.get("slowdown_c")
            return Reading(metric=str(data["metric"]), value=float(data["value"]), gpu=gpu,
                           worker=worker,
                           slowdown_c=None if slowdown is None else float(slowdown))
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("ignoring telemetry line (%s): %r", exc, line[:200])
        return None
    log.warning("ignoring telemetry line without cause or metric: %r", line[:200])
    return None


_NOT_CAUSE_CHARS = re.compile(r"[^a-z0-9_]+")


def normalise_cause(cause: str) -> str:
    """Return ``cause`` as the ledger writes causes: lower case, ``[a-z0-9_]``, starting
    with a letter, at most 64 characters (``NVLink-Down`` -> ``nvlink_down``); "" when
    nothing usable is left."""
    text = _NOT_CAUSE_CHARS.sub("_", cause.strip().lower()).strip("_")
    text = text.lstrip("0123456789_")
    return text[:64].rstrip("_")


class FileSignalSource:
    """Reads JSON lines appended to a file: ``{"worker": "w1", "cause": "ecc_rising"}``
    (a signal) or ``{"gpu": 0, "metric": "ecc_corrected", "value": 512}`` (a reading)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def poll(self) -> list[Reading | Signal]:
        """Return the complete lines appended since the previous poll."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # leave a half-written last line for the next poll
        self._offset += end
        out: list[Reading | Signal] = []
        for line in data[:end].decode("utf-8", "replace").splitlines():
            if line.strip() and (item := _parse_line(line)) is not None:
                out.append(item)
        return out


class CommandSignalSource:
    """Runs a command on each poll and parses its stdout as :class:`FileSignalSource` lines."""

    def __init__(self, command: str, timeout_s: float = 5.0) -> None:
        self.argv = shlex.split(command)
        self.timeout_s = timeout_s

    def poll(self) -> list[Reading | Signal]:
        """Run the command; a failing or slow command yields nothing (and a warning)."""
        try:
            proc = subprocess.run(self.argv, capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("telemetry command %s failed: %s", self.argv[0], exc)
            return []
        out: list[Reading | Signal] = []
        for line in proc.stdout.splitlines():
            if line.strip() and (item := _parse_line(line)) is not None:
                out.append(item)
        return out


class NvmlSource:
    """Reads ECC, row-remap, retired-page, temperature and XID data through NVML."""

    def __init__(self) -> None:
        self.available = False
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._events: Any = None
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
            self.available = True
        except Exception as exc:  # ImportError or NVMLError_LibraryNotFound & co.
            log.info("NVML telemetry unavailable (%s: %s); using the other signal sources",
                     type(exc).__name__, exc)
            return
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for h in self._handles:
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError,
                                                self._events)
        except Exception as exc:  # not every GPU/driver supports event registration
            log.info("NVML XID events unavailable (%s)", exc)
            self._events = None

    def poll(self) -> list[Reading | Signal]:
        """Sample every GPU; unsupported queries are skipped silently."""
        if not self.available:
            return []
        nv = self._nvml
        out: list[Reading | Signal] = []
        for i, h in enumerate(self._handles):
            probes: list[tuple[str, Any]] = [
                ("ecc_corrected", lambda h=h: nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)),
                ("ecc_uncorrected", lambda h=h: nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
                ("remap_pending", lambda h=h: nv.nvmlDeviceGetRemappedRows(h)[2]),
                ("retired_pending", lambda h=h: nv.nvmlDeviceGetRetiredPagesPendingStatus(h)),
            ]
            for metric, probe in probes:
                try:
                    out.append(Reading(metric=metric, value=float(probe()), gpu=i))
                except Exception:  # noqa: S112 - not supported on this device
                    continue
            try:
                temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                slow = nv.nvmlDeviceGetTemperatureThreshold(
                    h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
                out.append(Reading(metric="temperature_c", value=float(temp), gpu=i,
                                   slowdown_c=float(slow)))
            except Exception:  # noqa: S110 - not supported on this device
                pass
        if self._events is not None:
            while True:
                try:
                    ev = nv.nvmlEventSetWait_v2(self._events, 0)
                except Exception:
                    break  # NVML_ERROR_TIMEOUT: no pending event
                idx = next((i for i, h in enumerate(self._handles) if h == ev.device), None)
                out.append(Reading(metric="xid", value=float(ev.eventData), gpu=idx))
        return out
