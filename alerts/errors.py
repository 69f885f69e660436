"""Errors of the alerts domain (turned into exit codes or HTTP only at the edges).

Every class here but :class:`DeliveryBroken` is a :class:`ValueError`: the input was not
acceptable and the service that raised it wrote nothing.
"""

from __future__ import annotations


class AlertsError(ValueError):
    """Base class of the alerts' refusals of bad input."""


class BadDestination(AlertsError):
    """A destination's configuration is incomplete or malformed (the field is named)."""


class UnsafeAddress(BadDestination):
    """A webhook or SMTP host resolves to a link-local, metadata or other unsafe address."""


class UnknownDestination(AlertsError):
    """No destination with that name."""


class UnknownDelivery(AlertsError):
    """No delivery with that id (or not one the caller may see)."""


class DeliveryBroken(Exception):
    """A delivery's own rows are inconsistent (its event or destination missing): a named
    error, not an ``assert``, so that ``python -O`` keeps the guard. Not a ValueError: the
    caller's input was fine."""
