"""Errors of the billing domain (turned into exit codes or HTTP only at the edges).

Every class here is a :class:`ValueError`: it means "the input you gave is not
acceptable", and the service that raised it wrote nothing.
"""

from __future__ import annotations


class BillingError(ValueError):
    """Base class of billing's refusals of bad input."""


class PeriodOutOfRange(BillingError):
    """A contract year or month outside the contract's term."""


class YearNotEnded(BillingError):
    """A contract year that has not ended yet cannot be closed."""


class UnknownCredit(BillingError):
    """No credit with that id or credit-note number."""


class CreditNotApplicable(BillingError):
    """An application the credit cannot take (void, fully applied, more than remains)."""


class InvalidMoney(BillingError):
    """A malformed, negative or too precise amount of money."""


class UnknownDispute(BillingError):
    """No dispute with that id."""


class DisputeNotOpen(BillingError):
    """A dispute that was already resolved or rejected."""


class DisputeAlreadyOpen(BillingError):
    """The failure already has an open dispute (one open dispute per failure)."""


class SelfDecision(BillingError):
    """Whoever opened a dispute may not decide it."""


class UnknownFailure(BillingError):
    """A failure event id that is not a failure of the contract."""


class AmendmentRefused(BillingError):
    """An amendment that is malformed or would change a closed year."""


class ExportRefused(BillingError):
    """A finance export with a bad format or selection."""
