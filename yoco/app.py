"""The composition root's context: settings, the database, the signer, the projectors.

Built lazily by the CLI and the web app; nothing here runs at import time.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from yoco.settings import Settings, get_settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ledger.note import Signer, Verifier
    from ledger.projections import Projector
    from ledger.witnessing import WitnessEndpoint
    from yoco.database import Database


class SchemaNotReady(RuntimeError):
    """The database has not been migrated to the code's schema."""


def _where(url: str) -> str:
    """``host:port/database`` of a database URL, without the login or password."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return f"{u.host or 'localhost'}:{u.port or 5432}/{u.database or ''}"


class App:
    """Everything a command needs, created on first use."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()

    @cached_property
    def database(self) -> Database:
        """The database in use (the embedded one is started here when needed)."""
        from yoco.database import open_database

        return open_database(self.settings)

    @cached_property
    def engine(self) -> Engine:
        """An engine connected as the application role (INSERT/SELECT on the journal)."""
        return self.database.engine()

    def require_schema(self) -> None:
        """Raise :class:`SchemaNotReady` unless the database is migrated to head."""
        import migrations

        head = migrations.head_revision()
        from sqlalchemy.exc import OperationalError

        try:
            current = migrations.current(self.database.url)
        except OperationalError as exc:  # not reached: say so, not "run db upgrade"
            raise SchemaNotReady(
                f"cannot connect to the database at {_where(self.database.url)}: "
                f"{str(exc.orig or exc).strip().splitlines()[0]}"
            ) from exc
        except Exception as exc:  # other problems surface with their own message
            raise SchemaNotReady(
                f"cannot read the schema version (run `yoco db upgrade` as the owner or an "
                f"administrator): {exc}"
            ) from exc
        if current != head:
            raise SchemaNotReady(
                f"the database schema is at {current or 'nothing'}, the code needs {head}: "
                "run `yoco db upgrade` first"
            )

    @cached_property
    def signer(self) -> Signer:
        """The checkpoint signer; its key file is created (0600) on first use."""
        from ledger.note import load_or_create_signer

        return load_or_create_signer(self.settings.signer_key_file, self.settings.log_origin)

    @property
    def verifier(self) -> Verifier:
        """The verifier of the checkpoint signer's key."""
        from ledger.note import Verifier

        return Verifier.from_text(self.signer.verifier_text())

    @cached_property
    def witnesses(self) -> list[WitnessEndpoint]:
        """The configured witnesses (``YOCO_WITNESSES``), parsed."""
        from ledger.witnessing import parse_witnesses

        return parse_witnesses(self.settings.witnesses)

    @property
    def witness_quorum(self) -> int:
        """How many witnesses must cosign a checkpoint (default: all configured)."""
        q = self.settings.witness_quorum
        n = len(self.witnesses)
        if q is not None and q > n:
            raise ValueError(f"YOCO_WITNESS_QUORUM: {q} is more than the {n} witnesses")
        return n if q is None else q

    @property
    def projectors(self) -> list[Projector]:
        """Projectors of entry kinds owned by packages above the ledger (billing)."""
        return list(extra_projectors())

    @property
    def projection_tables(self) -> list[str]:
        """Projection tables of packages above the ledger, emptied by a rebuild."""
        return list(extra_projection_tables())

    @property
    def projected_kinds(self) -> frozenset[str]:
        """Every entry kind some projection reads (ledger's and billing's)."""
        from ledger.projections import KINDS

        return KINDS | extra_projected_kinds()

    def close(self) -> None:
        """Release connections (the embedded server stops when the process exits)."""
        if "engine" in self.__dict__:
            self.engine.dispose()


def extra_projectors() -> tuple[Projector, ...]:
    """Projectors the composition root wires into the ledger (billing's entry kinds)."""
    from billing import projections

    return tuple(projections.PROJECTORS)


def extra_projection_tables() -> tuple[str, ...]:
    """Tables of the projectors of :func:`extra_projectors`, children first."""
    from billing import projections

    return tuple(projections.TABLES)


def extra_projected_kinds() -> frozenset[str]:
    """Entry kinds the projectors of :func:`extra_projectors` read."""
    from billing import projections

    return frozenset(projections.KINDS)
