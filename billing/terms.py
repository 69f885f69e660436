"""Guarantee terms of a contract (DESIGN section 2 and the ``terms`` object of section 4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from ledger.cosign import WitnessPolicy
from ledger.errors import WitnessPolicyError

__all__ = [
    "DEFAULT_COVERED_CLASSES",
    "DEFAULT_CREDIT_PERCENT",
    "DEFAULT_EXCLUDED_CAUSES",
    "DEFAULT_THRESHOLD_PERCENT",
    "FAILURE_CLASSES",
    "Terms",
    "parse_percent",
]

FAILURE_CLASSES: frozenset[str] = frozenset({"unplanned", "preemptive", "planned"})
DEFAULT_THRESHOLD_PERCENT = Decimal(90)
DEFAULT_CREDIT_PERCENT = Decimal(25)
DEFAULT_COVERED_CLASSES: frozenset[str] = frozenset({"unplanned", "preemptive"})
DEFAULT_EXCLUDED_CAUSES: frozenset[str] = frozenset(
    {"network_wide_outage", "facility_power", "customer_code"}
)

_KEYS = ("threshold_percent", "credit_percent", "covered_classes", "excluded_causes", "witnesses")


def parse_percent(name: str, value: object) -> Decimal:
    """Return ``value`` as an exact Decimal percentage with ``0 < p <= 100``.

    Accepts a Decimal, an int, or a decimal string (``"90"``, ``"92.5"``); refuses floats,
    booleans, non-finite values and anything out of range with a ValueError naming ``name``.
    """
    if isinstance(value, (bool, float)):
        raise ValueError(f"{name}: expected a decimal string or integer, got {value!r}")
    if isinstance(value, Decimal):
        p = value
    elif isinstance(value, int):
        p = Decimal(value)
    elif isinstance(value, str):
        try:
            p = Decimal(value.strip())
        except InvalidOperation as exc:
            raise ValueError(f"{name}: not a decimal number: {value!r}") from exc
    else:
        raise ValueError(f"{name}: expected a decimal string or integer, got {value!r}")
    if not p.is_finite():
        raise ValueError(f"{name}: must be finite, got {value!r}")
    if not (0 < p <= 100):
        raise ValueError(f"{name}: must satisfy 0 < percent <= 100, got {p}")
    return p


def _str_set(name: str, value: object) -> frozenset[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name}: expected a list of strings, got {value!r}")
    items = list(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise ValueError(f"{name}: expected non-empty strings, got {item!r}")
    return frozenset(items)


@dataclass(frozen=True, slots=True, kw_only=True)
class Terms:
    """The guarantee terms: threshold, credit and what counts as a covered failure.

    ``threshold_percent`` and ``credit_percent`` are exact Decimals with ``0 < p <= 100``;
    ``covered_classes`` is a subset (possibly empty) of ``unplanned``, ``preemptive`` and
    ``planned``; ``excluded_causes`` is any set of non-empty cause codes; ``witnesses``
    is the contract's witness policy (:class:`ledger.cosign.WitnessPolicy`: which witnesses
    must cosign a checkpoint before it counts for the contract), None when it has none.
    """

    threshold_percent: Decimal = DEFAULT_THRESHOLD_PERCENT
    credit_percent: Decimal = DEFAULT_CREDIT_PERCENT
    covered_classes: frozenset[str] = field(default=DEFAULT_COVERED_CLASSES)
    excluded_causes: frozenset[str] = field(default=DEFAULT_EXCLUDED_CAUSES)
    witnesses: WitnessPolicy | None = None

    def __post_init__(self) -> None:
        if isinstance(self.threshold_percent, str):
            raise ValueError("threshold_percent: expected a Decimal, got a string")
        if isinstance(self.credit_percent, str):
            raise ValueError("credit_percent: expected a Decimal, got a string")
        object.__setattr__(
            self, "threshold_percent", parse_percent("threshold_percent", self.threshold_percent)
        )
        object.__setattr__(
            self, "credit_percent", parse_percent("credit_percent", self.credit_percent)
        )
        classes = _str_set("covered_classes", self.covered_classes)
        unknown = classes - FAILURE_CLASSES
        if unknown:
            raise ValueError(
                f"covered_classes: unknown failure class(es) {sorted(unknown)}; "
                f"expected a subset of {sorted(FAILURE_CLASSES)}"
            )
        object.__setattr__(self, "covered_classes", classes)
        object.__setattr__(
            self, "excluded_causes", _str_set("excluded_causes", self.excluded_causes)
        )
        if self.witnesses is not None and not isinstance(self.witnesses, WitnessPolicy):
            raise ValueError(f"witnesses: expected a WitnessPolicy, got {self.witnesses!r}")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> Terms:
        """Build terms from the contract's ``terms`` JSON object (None: all defaults).

        Missing keys take their defaults.  Percentages may be decimal strings or integers
        (never floats); classes and causes are JSON arrays of strings.  Unknown keys and
        bad values raise ValueError naming the field (``terms.<key>``).
        """
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError(f"terms: expected a JSON object, got {obj!r}")
        unknown = sorted(set(obj) - set(_KEYS))
        if unknown:
            raise ValueError(f"terms: unknown field(s) {unknown}")
        kwargs: dict[str, Any] = {}
        for key in ("threshold_percent", "credit_percent"):
            if key in obj:
                kwargs[key] = parse_percent(f"terms.{key}", obj[key])
        for key in ("covered_classes", "excluded_causes"):
            if key in obj:
                value = obj[key]
                if not isinstance(value, (list, tuple)):
                    raise ValueError(f"terms.{key}: expected a JSON array, got {value!r}")
                kwargs[key] = _str_set(f"terms.{key}", value)
        if obj.get("witnesses") is not None:
            try:
                kwargs["witnesses"] = WitnessPolicy.from_json(obj["witnesses"], "terms.witnesses")
            except WitnessPolicyError as exc:
                raise ValueError(str(exc)) from None
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"terms.{exc}") from exc

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form: percentages as decimal strings, sets as sorted arrays.

        Promises: ``Terms.from_json(t.to_json()) == t``; the output is deterministic;
        ``witnesses`` appears only when the terms hold a witness policy.
        """
        out: dict[str, Any] = {
            "threshold_percent": format(self.threshold_percent, "f"),
            "credit_percent": format(self.credit_percent, "f"),
            "covered_classes": sorted(self.covered_classes),
            "excluded_causes": sorted(self.excluded_causes),
        }
        if self.witnesses is not None:
            out["witnesses"] = self.witnesses.to_json()
        return out
