"""Errors raised by the migration runtime.

Every error the runtime raises on purpose derives from :class:`YocoRuntimeError`, so a
caller can tell "the runtime refused or gave up" apart from a bug. Configuration errors
are also :class:`ValueError` because they are bad input.
"""

from __future__ import annotations


class YocoRuntimeError(Exception):
    """Base class of every error raised on purpose by ``runtime``."""


class ConfigError(YocoRuntimeError, ValueError):
    """A configuration value is out of range or inconsistent."""


class RecordError(YocoRuntimeError, ValueError):
    """A record does not follow the ingestion format (DESIGN section 4)."""


class SinkError(YocoRuntimeError):
    """A sink could not durably acknowledge a batch of records; the batch must be retried."""

    #: True when retrying cannot succeed (the sink refuses the content, not an outage).
    permanent = False


class RecordRefused(SinkError):
    """The sink refuses a record for good (its content, not an outage): retrying the same
    record can never succeed, so the outbox moves it to the dead-letter file."""

    permanent = True


class OutboxError(YocoRuntimeError):
    """The local durable outbox could not be written or read."""


class SinkSpecError(ConfigError):
    """A sink specification (``jsonl:PATH`` or ``module:factory``) cannot be resolved."""


class CheckpointError(YocoRuntimeError):
    """A checkpoint could not be written or loaded."""


class CollectiveError(YocoRuntimeError):
    """A collective operation of the current process group failed."""


class GenerationChanged(YocoRuntimeError):
    """The supervisor published a new membership generation; the step in flight is void.

    Internal control flow of a worker: it unwinds the step in flight so that its update
    is never applied.
    """

    def __init__(self, gen: int) -> None:
        super().__init__(f"membership generation {gen} published")
        self.gen = gen


class FaultSpecError(ConfigError):
    """A fault-injection specification cannot be parsed."""


class JobFailedError(YocoRuntimeError):
    """The job could not recover (outcome ``failed``)."""


class DrainError(YocoRuntimeError):
    """A drain request names no running job or no worker of that job."""


class NoSpareError(DrainError):
    """A drain cannot be served: the job has no spare to move the worker onto."""


class TransparentError(YocoRuntimeError):
    """Transparent mode met a script it cannot run faithfully (a use of
    ``torch.distributed`` it does not replace, or a replacement that could not be placed
    where the job is): it stops rather than train on a wrong state."""


class OutcomeTwiceError(YocoRuntimeError):
    """A failure was about to get a second outcome (each gets exactly one): a bug in the
    coordinator's sequencing, stopped before it reaches the records."""
