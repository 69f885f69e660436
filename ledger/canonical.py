"""Strict JSON input and RFC 8785 canonical bytes: re-exported from :mod:`yoco_records.canonical`.

The one home of these rules is the torch-free ``yoco_records`` package, which the runtime
uses too; the ledger keeps this module so its imports read ``ledger.canonical``.
"""

from yoco_records.canonical import (
    MAX_SAFE_INTEGER,
    CanonicalizationError,
    JsonInputError,
    canonical_bytes,
    decimal_of,
    format_path,
    parse_json_strict,
)

__all__ = [
    "MAX_SAFE_INTEGER",
    "CanonicalizationError",
    "JsonInputError",
    "canonical_bytes",
    "decimal_of",
    "format_path",
    "parse_json_strict",
]
