"""Errors of the billing domain (turned into exit codes or HTTP only at the edges)."""

from __future__ import annotations


class BillingError(ValueError):
    """Base class of billing's refusals of bad input."""


class PeriodOutOfRange(BillingError):
    """A contract year or month outside the contract's term."""
