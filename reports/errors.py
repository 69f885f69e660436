"""Errors of the reports domain: every refusal of bad input is a ``ValueError``.

The CLI turns them into exit status 2 and the portal into HTTP 4xx, with the message
as written here (each one says what was wrong and what to do).
"""

from __future__ import annotations


class ReportError(ValueError):
    """Base class of the reports' refusals of bad input."""


class BadMonth(ReportError):
    """A month that is not ``YYYY-MM`` or not a real calendar month."""


class BadFormat(ReportError):
    """An output format other than ``html`` and ``pdf``."""


class NoCheckpoint(ReportError):
    """The contract's log has no signed checkpoint yet (nothing a report could rest on)."""


class UnknownCheckpoint(ReportError):
    """No signed checkpoint of the contract's log has the tree size asked for."""


class MonthOutOfTerm(ReportError):
    """The month does not overlap the contract's term."""


class CheckpointTooOld(ReportError):
    """The checkpoint was signed before the month began: it cannot speak for that month."""


class MonthNotOver(ReportError):
    """The month is not over at the checkpoint: an issued report speaks for a whole month."""


class NotIssued(ReportError):
    """No document of that contract and period has been issued (yet)."""


class AlreadyIssued(ReportError):
    """The month was issued already, over another checkpoint or as other bytes."""


class NotWitnessed(ReportError):
    """The checkpoint does not meet the contract's witness policy (``terms.witnesses``):
    a report of a contract with a policy is issued only over a checkpoint that does."""
