"""yoco-verify: check a yoco ledger export offline and recompute a report's figures.

Standalone: no database, no web framework, no torch, and no top-level package but this
one.  It shares only the main project's pure modules (canonical JSON, the Merkle tree and
tiles, signed notes, the record schema, the SLA definitions, the terminal-text
neutraliser), as exact copies under :mod:`yoco_verify.shared` written by
``scripts/vendor_verifier.py`` (``tests/audit/test_vendored.py`` holds them equal).
"""

__all__ = ["VerifyError"]


class VerifyError(Exception):
    """A check failed; the message says which and why."""
