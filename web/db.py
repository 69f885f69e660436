"""The portal's two ways into the database.

- ``read(principal)``: a session as the role ``yoco_portal`` (SELECT only, row-level
  security on), in one transaction whose settings ``yoco.customer`` / ``yoco.scope`` name
  the caller's tenant (``SET LOCAL``: they end with the transaction, so a pooled
  connection never carries them to the next request).
- ``write()``: a unit of work as the application role (users, sessions, tokens, ingest,
  billing actions); callers check tenancy first, through ``read``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from ledger.errors import InvariantBroken
from ledger.sessions import APP_ROLE, PORTAL_ROLE, login_engine, unit_of_work
from web.accounts import Principal


def _refusal(user: str) -> str:
    return (
        f"the portal refuses to log in as {user!r}, a superuser: set "
        "YOCO_PORTAL_DATABASE_URL to the login role yoco_web (see README)"
    )


def portal_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose every connection has switched to the ``yoco_portal`` role.

    A superuser login is refused (:class:`ledger.errors.SuperuserLogin`).
    """
    kwargs.setdefault("pool_recycle", 1800)
    return login_engine(url, role=PORTAL_ROLE, refusal=_refusal, **kwargs)


def probe_engine(url: str, **kwargs: Any) -> Engine:
    """Connections of the ``yoco_portal`` role in autocommit mode, for the visibility
    probe: set once when connected, and not reset when returned to the pool (an
    autocommit connection holds no transaction, and the probe's settings are
    transaction-local), so a probe costs its one round trip and nothing else."""
    kwargs.setdefault("pool_recycle", 1800)
    kwargs.setdefault("pool_reset_on_return", None)
    return login_engine(url, role=PORTAL_ROLE, refusal=_refusal,
                        isolation_level="AUTOCOMMIT", **kwargs)


async def probe_connection(engine: Engine) -> Any:
    """A new ``asyncio`` connection like the probe engine's (:func:`probe_engine`): the
    same login, switched to the ``yoco_portal`` role, in autocommit mode, for the probe
    run in the event loop (:class:`web.fastlane.AsyncProbe`).

    Logging in as a superuser is refused as every engine of the portal refuses it
    (:class:`ledger.errors.SuperuserLogin`, the check of
    :func:`ledger.sessions.login_engine`, which has no asyncio form).
    """
    import psycopg

    from ledger.errors import SuperuserLogin

    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    cparams.pop("context", None)  # the sync dialect's adapters: not needed for the probe
    conn = await psycopg.AsyncConnection.connect(*cargs, **cparams, autocommit=True)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"SET ROLE {PORTAL_ROLE}")
            await cur.execute(
                "SELECT session_user, rolsuper FROM pg_roles WHERE rolname = session_user"
            )
            row = await cur.fetchone()
        if row is None:
            raise InvariantBroken("the server did not say who is logged in")
        user, superuser = row
        if superuser:
            raise SuperuserLogin(_refusal(user))
    except BaseException:
        await conn.close()
        raise
    return conn


def app_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose every connection has switched to the ``yoco_app`` role (writes).

    A superuser login is refused (:class:`ledger.errors.SuperuserLogin`).
    """
    kwargs.setdefault("pool_pre_ping", True)
    return login_engine(url, role=APP_ROLE, refusal=_refusal, **kwargs)


def scope_settings(principal: Principal) -> tuple[str, str]:
    """The (``yoco.customer``, ``yoco.scope``) values of a principal's transactions."""
    if principal.is_staff:
        return "", "all"
    return principal.customer or "", ""


_SETTINGS = (
    "SELECT set_config('yoco.customer', %(c)s, true), set_config('yoco.scope', %(s)s, true); "
)
_PROBE = _SETTINGS + (
    "SELECT c.contract_id, l.size, "
    "(SELECT max(k.tree_size) FROM checkpoints AS k WHERE k.log_id = c.contract_id), "
    "(SELECT max(w.id) FROM checkpoint_cosignatures AS w WHERE w.log_id = c.contract_id) "
    "FROM contracts AS c "
    "LEFT OUTER JOIN ledger_logs AS l ON l.log_id = c.contract_id "
    "WHERE c.contract_id = %(id)s"
)
_PROBE_STAFF = _PROBE
_PROBE_CUSTOMER = _PROBE + " AND c.customer = %(c)s AND %(c)s <> ''"
# What the contract list shows, in one row: how many contracts the caller sees and a
# digest of each one's id and log size (ids length-prefixed: no two lists digest alike).
_LIST = _SETTINGS + (
    "SELECT count(*), md5(coalesce(string_agg("
    "length(c.contract_id) || ':' || c.contract_id || '=' || coalesce(l.size, 0), ',' "
    "ORDER BY c.contract_id), '')) "
    "FROM contracts AS c "
    "LEFT OUTER JOIN ledger_logs AS l ON l.log_id = c.contract_id"
)
_LIST_STAFF = _LIST
_LIST_CUSTOMER = _LIST + " WHERE c.customer = %(c)s AND %(c)s <> ''"


def probe_statement(
    scope: tuple[str, str], contract_id: str | None
) -> tuple[str, dict[str, str]]:
    """The visibility probe of ``contract_id`` (None: of the list of contracts) for a
    caller of tenant ``scope`` (:func:`scope_settings`): two statements for ONE simple
    query on an autocommit connection (bound client-side), and its parameters.  Its last
    row is read by :func:`probe_state`."""
    customer, setting = scope
    staff = setting == "all"
    if contract_id is None:
        return (_LIST_STAFF if staff else _LIST_CUSTOMER), {"c": customer, "s": setting}
    sql = _PROBE_STAFF if staff else _PROBE_CUSTOMER
    return sql, {"c": customer, "s": setting, "id": contract_id}


@dataclass(frozen=True, slots=True)
class LogState:
    """What a contract's log holds, as far as an answer about it can change: its size
    (entries), the tree size of its latest signed checkpoint (0: none) and the id of the
    latest witness cosignature stored for it (0: none; cosignatures arrive after their
    checkpoint is signed, so ``signed`` alone does not name what a checkpoint shows)."""

    size: int
    signed: int
    cosigned: int

    @property
    def heads(self) -> tuple[int, int]:
        """What an answer showing signed checkpoints (their notes carry the witnesses'
        cosignature lines) is a function of, for its tag: the latest head and the latest
        cosignature."""
        return (self.signed, self.cosigned)


@dataclass(frozen=True, slots=True)
class ListState:
    """What the caller's list of contracts shows, as far as an answer about it can
    change: how many there are and a digest of their ids and log sizes."""

    count: int
    digest: str


def probe_state(row: Any, contract_id: str | None) -> LogState | ListState | None:
    """The state in the last row of :func:`probe_statement`'s probe (None: no row, the
    contract is not visible)."""
    if contract_id is None:
        if row is None:  # an aggregate: always one row
            raise InvariantBroken("the contract list's probe returned no row")
        return ListState(count=int(row[0]), digest=str(row[1]))
    if row is None:
        return None
    return LogState(size=int(row[1] or 0), signed=int(row[2] or 0),
                    cosigned=int(row[3] or 0))


class PortalDb:
    """The portal role's engine and the application role's engine of one app."""

    def __init__(
        self, app_engine: Engine, read_engine: Engine, probe_engine: Engine | None = None
    ) -> None:
        self.app_engine = app_engine
        self.read_engine = read_engine
        #: Connections of the portal role kept in autocommit mode for the one-query
        #: visibility probe (:meth:`visible_state`); None: borrow the read engine's.
        self.probe_engine = probe_engine
        self._read = sessionmaker(bind=read_engine, expire_on_commit=False)
        self._write = sessionmaker(bind=app_engine, expire_on_commit=False)

    @contextmanager
    def read(self, principal: Principal, *, snapshot: bool = False) -> Iterator[Session]:
        """A read-only session scoped to ``principal``'s tenant by row-level security.

        ``snapshot``: every statement sees the same snapshot (REPEATABLE READ), so a
        computation that reads the log size first and then the records reads records of
        exactly that size (an answer's tag names the size).
        """
        customer, scope = scope_settings(principal)
        session = self._read()
        try:
            if snapshot:
                session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            session.execute(
                text(
                    "SELECT set_config('yoco.customer', :c, true), "
                    "set_config('yoco.scope', :s, true)"
                ),
                {"c": customer, "s": scope},
            )
            yield session
        finally:
            session.rollback()
            session.close()

    def write(self) -> AbstractContextManager[Session]:
        """A unit of work as the application role: committed on success, else rolled back
        (:func:`ledger.sessions.unit_of_work`, the one place that commits)."""
        return unit_of_work(self._write)

    def visible_size(self, principal: Principal, contract_id: str) -> int | None:
        """The contract's log size if ``principal`` may see the contract, else None
        (:meth:`visible_state`)."""
        state = self.visible_state(principal, contract_id)
        return None if state is None else state.size

    def visible_state(self, principal: Principal, contract_id: str) -> LogState | None:
        """The contract's log state if ``principal`` may see the contract, else None.

        The same check as :func:`web.services.visible_size` (the customer filter in the
        query, under row-level security scoped to the caller), in ONE round trip: the
        two statements go as one simple query on a connection in autocommit mode, which
        PostgreSQL runs as one implicit transaction, so the ``SET LOCAL``-style settings
        apply to the second statement and are gone when it ends.  Parameters are bound
        client-side by psycopg's ``ClientCursor`` (quoted as literals).
        """
        state = self._probe(principal, contract_id)
        if isinstance(state, ListState):
            raise InvariantBroken("a contract's probe answered with a list")
        return state

    def visible_list_state(self, principal: Principal) -> ListState:
        """What ``principal``'s list of contracts shows (:class:`ListState`), in one
        round trip as :meth:`visible_state`."""
        state = self._probe(principal, None)
        if not isinstance(state, ListState):
            raise InvariantBroken("the list's probe answered with a contract")
        return state

    def _probe(
        self, principal: Principal, contract_id: str | None
    ) -> LogState | ListState | None:
        import psycopg

        sql, params = probe_statement(scope_settings(principal), contract_id)
        own = self.probe_engine is not None
        fairy = (self.probe_engine or self.read_engine).raw_connection()
        try:
            conn = fairy.driver_connection
            if not isinstance(conn, psycopg.Connection):
                raise InvariantBroken("the probe engine is not a psycopg connection")
            was = conn.autocommit
            if not was:  # the pool hands out idle connections: no transaction
                conn.autocommit = True
            try:
                with psycopg.ClientCursor(conn) as cur:
                    cur.execute(sql, params)
                    cur.nextset()
                    row = cur.fetchone()
            finally:
                if not was:
                    conn.autocommit = was
        except BaseException:
            if own:
                fairy.invalidate()  # whatever broke, this connection is not reused
            raise
        finally:
            fairy.close()
        return probe_state(row, contract_id)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.read_engine.dispose()
        if self.probe_engine is not None:
            self.probe_engine.dispose()
        self.app_engine.dispose()
