"""yoco migration runtime: fault-tolerant data-parallel training with live migration.

Worker side: :class:`~runtime.job.Job`. Launcher: :func:`~runtime.supervisor.launch`.
Reporting: :class:`~runtime.sink.RecordSink` (implemented by the ledger).
This package imports nothing from ledger, billing, reports, web or yoco.

The names below are imported on first use, so that ``runtime.control`` (``yoco drain``),
``runtime.outbox`` and ``runtime.records`` work without importing torch (seconds).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Job": "runtime.job",
    "JobConfig": "runtime.job",
    "local_device": "runtime.job",
    "ShardedSampler": "runtime.data",
    "YocoRuntimeError": "runtime.errors",
    "JsonlFileSink": "runtime.sink",
    "RecordSink": "runtime.sink",
    "SinkSpec": "runtime.sink",
    "parse_sink_spec": "runtime.sink",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import an exported name on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
