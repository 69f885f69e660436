"""How often checkpoints are signed, in words and as a default: pure (no database), so
the settings of a runtime-only install (no server extra) can name the default."""

from __future__ import annotations

from datetime import timedelta

__all__ = ["CHECKPOINT_EVERY", "describe_interval"]

#: How often a log with new entries gets a signed checkpoint by default (``yoco serve``'s
#: scheduler and the deploy/ timers; setting ``YOCO_LEDGER_CHECKPOINT_EVERY_S``). An entry
#: is under a signed checkpoint, and so has an inclusion proof, at most this long (plus
#: one run's duration) after it is appended.
CHECKPOINT_EVERY = timedelta(minutes=5)


def describe_interval(seconds: float) -> str:
    """Words for a checkpoint interval: ``"5 minutes"``, ``"1 hour"``, ``"90 seconds"``."""
    if not seconds > 0:
        raise ValueError(f"interval: must be positive, got {seconds!r}")
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    amount: float = int(seconds) if float(seconds).is_integer() else seconds
    return f"{amount:g} second{'s' if amount != 1 else ''}"
