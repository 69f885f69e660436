"""yoco-verify: check a yoco ledger export offline and recompute a report's figures.

Standalone: no database, no web framework, no torch.  It shares only the main project's
pure modules (canonical JSON, the Merkle tree and tiles, signed notes, proofs, the record
schema and the SLA definitions), installed with it from the same files.
"""

__all__ = ["VerifyError"]


class VerifyError(Exception):
    """A check failed; the message says which and why."""
