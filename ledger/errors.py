"""Exceptions raised by the ledger's pure (database-free) modules.

Every :class:`LedgerError` is a :class:`ValueError`: it means "the input you gave me (a
proof, a note, a key, a bundle) is not acceptable". :class:`MissingNodeError` is the one
exception: a :class:`LookupError` for an incomplete Merkle node store.
Other ledger modules may add their own small, clearly named classes to this file.
"""

from __future__ import annotations

__all__ = [
    "InvariantBroken",
    "KeyFileError",
    "LedgerError",
    "LogInconsistent",
    "MissingNodeError",
    "NoteError",
    "ProofError",
    "SuperuserLogin",
    "TreeSizeError",
    "WitnessPolicyError",
    "ensure",
]


class LedgerError(ValueError):
    """Base class of the ledger's input-rejection errors."""


class WitnessPolicyError(LedgerError):
    """A contract's witness policy (``terms.witnesses``) is malformed: ``field`` names the
    part (``terms.witnesses.keys[1]``), ``reason`` says what is wrong with it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class ProofError(LedgerError):
    """A Merkle inclusion/consistency proof, or a proof bundle, failed to verify or is malformed."""


class NoteError(LedgerError):
    """A signed note, checkpoint or note key is malformed, forged or not signed by the key."""


# --- journal and ingestion (database-backed services) ------------------------------


class IngestRefused(LedgerError):
    """A batch was refused: nothing from it was written.

    ``errors`` holds one entry per refused record, each naming its line (or
    index) and field; ``count`` is how many there were in all (a wholly wrong file keeps
    only the first ones in ``errors``, see :data:`ledger.stream.MAX_ERRORS`).
    """

    def __init__(self, errors: list, what: str = "batch", *, count: int | None = None) -> None:
        self.errors = list(errors)
        self.what = what
        self.count = max(len(self.errors), count or 0)
        first = "; ".join(str(e) for e in self.errors[:3])
        more = f" (and {self.count - 3} more)" if self.count > 3 else ""
        super().__init__(f"{what} refused, nothing written: {first}{more}")


class InvariantBroken(RuntimeError):
    """A condition the code relies on does not hold: a bug, or data changed outside yoco.

    The named error every guard raises instead of ``assert`` (which ``python -O``
    removes). Not a :class:`LedgerError`: the caller's input was fine."""


def ensure(condition: object, message: str) -> None:
    """Raise :class:`InvariantBroken` with ``message`` unless ``condition`` is true; the
    one replacement of a safety ``assert`` (kept under ``python -O``)."""
    if not condition:
        raise InvariantBroken(message)


class SuperuserLogin(RuntimeError):
    """A process of the application would log in as a superuser (DESIGN section 5: no
    process does). Not a :class:`LedgerError`: the caller's input is fine, the
    deployment is not."""


class UnknownEntry(LedgerError):
    """No journal entry has the given event id."""


class UnknownContract(LedgerError):
    """No contract has the given id."""


class CheckpointRefused(LedgerError):
    """A tree head could not be signed (it is not consistent with the last signed one)."""


class LogInconsistent(CheckpointRefused):
    """A log's stored size, Merkle nodes and journal disagree (changed outside yoco):
    that log is not signed, and says why; other logs are not affected."""

    def __init__(self, log_id: str, message: str) -> None:
        self.log_id = log_id
        super().__init__(f"log {log_id!r}: {message}; run `yoco ledger verify`")


class VerificationFailed(LedgerError):
    """The stored journal does not match its hashes, tree or signed checkpoints,
    or a projection does not match the journal (``table``, ``key``, ``column``)."""

    def __init__(self, message: str, *, log_id: str | None = None, seq: int | None = None,
                 event_id: str | None = None, table: str | None = None,
                 key: dict[str, object] | None = None, column: str | None = None) -> None:
        self.log_id = log_id
        self.seq = seq
        self.event_id = event_id
        self.table = table
        self.key = key
        self.column = column
        super().__init__(message)


class TreeSizeError(LedgerError):
    """A leaf index, tree size, frontier or leaf hash does not fit the Merkle tree asked about."""


class KeyFileError(LedgerError):
    """A signer key file is unreadable, malformed, for another key name, or unsafely readable."""


class MissingNodeError(LookupError):
    """A Merkle node the computation needs is absent from the node source (store corruption).

    Not a ValueError: the caller's input was fine, the node store is incomplete.
    """

    def __init__(self, level: int, index: int) -> None:
        super().__init__(f"Merkle node (level={level}, index={index}) is missing from the store")
        self.level = level
        self.index = index
