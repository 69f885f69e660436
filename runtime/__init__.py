"""yoco migration runtime: fault-tolerant data-parallel training with live migration.

Worker side: :class:`~runtime.job.Job`. Launcher: :func:`~runtime.supervisor.launch`.
Reporting: :class:`~runtime.sink.RecordSink` (implemented by the ledger).
This package imports nothing from ledger, billing, reports, web or yoco.
"""

from runtime.data import ShardedSampler
from runtime.errors import YocoRuntimeError
from runtime.job import Job, JobConfig, local_device
from runtime.sink import JsonlFileSink, RecordSink, SinkSpec, parse_sink_spec

__all__ = [
    "Job",
    "JobConfig",
    "JsonlFileSink",
    "RecordSink",
    "ShardedSampler",
    "SinkSpec",
    "YocoRuntimeError",
    "local_device",
    "parse_sink_spec",
]
