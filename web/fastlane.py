"""The API's fast lane: a repeated GET answered again without FastAPI, in the event loop.

A GET of ``/api/v1`` is a function of a few inputs (see :mod:`web.conditional`): the
request target, the caller's tenant scope, its ``If-None-Match``, the state of the
contract's log (its size and latest signed tree size) and, for figures that depend on
the time, the figures instant.  A handler that knows its answer is exactly such a
function *declares* it (:func:`declare`: the scope, the log state and the instant it
used); :class:`FastLane`, a plain ASGI middleware outside everything else, then keeps
the complete response (status, every header, body) under

    (scope, raw path, raw query, If-None-Match) -> (log state, instant, response)

and answers the next request with the same key from it, **only** when

- the caller is known without asking the database, by the very rule the handlers use
  (:func:`web.deps.known_principal`: a bearer token or a session seen live within
  ``YOCO_WEB_SESSION_CACHE_SECONDS``) and may read (``can_read``), and its scope is
  the kept one — so one tenant's answer never reaches another, and revocation works as
  it does for every read (within that TTL);
- the figures instant now is the kept one;
- the visibility probe, run now in the event loop (:class:`AsyncProbe`), sees the
  contract for this scope with the kept log state — so an answer is never older than
  the ledger state it claims, and a contract the caller may not see is never answered
  from here (the handler answers 404).

Anything else — another method, a path outside ``/api/v1``, an unknown caller, no kept
answer, a different state, an error of the probe — goes to the application as before.
What is replayed is byte for byte what the handler sent for an identical request in
the identical state, so the behaviour of every route is unchanged; what is saved is
the routing, the dependency solving, the hop to the thread pool and the pooled
connection checkout of each repeated request, and concurrent requests for one contract
share one probe round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from web.accounts import Principal
from web.db import ListState, LogState, probe_state, probe_statement, scope_settings

State = LogState | ListState

if TYPE_CHECKING:
    from fastapi import Request

    from web.portal import Portal

log = logging.getLogger("yoco.web")

#: Where a handler finds the declaration holder of its request (the ASGI scope key).
SCOPE_KEY = "yoco.fastlane"
#: The scope of answers that depend on no caller (the signer's public key).
PUBLIC: tuple[str, str] = ("\x00public", "")
PREFIX = "/api/v1/"
LIST = "/api/v1/contracts"
CONTRACTS = LIST + "/"
PUBLIC_PATHS = frozenset({"/api/v1/public-key"})


@dataclass(slots=True)
class Declaration:
    """What a handler said its answer is a function of (see :func:`declare`)."""

    scope: tuple[str, str] | None = None
    state: State | None = None
    at: datetime | None = None
    set: bool = False


def declare(
    request: Request,
    principal: Principal | None,
    state: State | None,
    at: datetime | None,
) -> None:
    """Say that the answer about to be returned is exactly a function of the request
    target, ``If-None-Match``, ``principal``'s tenant scope (None: of nobody, a public
    answer), the contract log ``state`` and the figures instant ``at``: the fast lane may
    replay it to an identical request while those are unchanged.

    Declare only what is true: an answer made from anything else (a view or figures of
    another instant served while the current ones are computed, the log grown between
    the probe and the read) must not be declared.  Only for routes that let in whoever
    may read the tenant's data (``ReaderDep``): the scope is all the fast lane checks.
    """
    holder = request.scope.get(SCOPE_KEY)
    if isinstance(holder, Declaration):
        holder.scope = PUBLIC if principal is None else scope_settings(principal)
        holder.state = state
        holder.at = at
        holder.set = True


@dataclass(slots=True)
class Kept:
    """One kept answer and what it was made of."""

    state: State | None
    at: datetime | None
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.body) + sum(len(k) + len(v) for k, v in self.headers) + 64


class ReplayCache:
    """Kept answers by (scope, raw path, raw query, If-None-Match), least recently used
    first out when their bytes pass ``max_bytes`` (thread-safe: test clients run several
    event loops on one app)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: tuple[Any, ...]) -> Kept | None:
        """The answer kept under ``key``, or None."""
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None:
                self._entries.move_to_end(key)
            return kept

    def put(self, key: tuple[Any, ...], kept: Kept) -> None:
        """Keep ``kept`` under ``key`` (replacing what was there)."""
        if kept.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[key] = kept
            self._bytes += kept.size
            while self._bytes > self.max_bytes:
                _, out = self._entries.popitem(last=False)
                self._bytes -= out.size

    def clear(self) -> None:
        """Forget every kept answer."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


_Key = tuple[str, str, str | None]


class _LoopProbes:
    """The probe connections and the pending probes of one event loop."""

    def __init__(self, connections: int) -> None:
        self.idle: asyncio.Queue[Any] = asyncio.Queue()
        self.made = 0
        self.limit = connections
        self.waiting: dict[_Key, list[asyncio.Future[State | None]]] = {}
        self.drivers: dict[_Key, asyncio.Task[None]] = {}
        self.all: list[Any] = []


class AsyncProbe:
    """The visibility probe (:func:`web.db.probe_statement`) on autocommit ``asyncio``
    connections of the portal role, in the event loop, shared by concurrent callers.

    Only the loops started with :meth:`start` (the server's, in the application's
    lifespan) get connections; :meth:`state` raises :class:`LookupError` elsewhere.

    Requests of one (scope, contract) that arrive while a probe of theirs is running
    wait for the **next** probe, which starts when that one ends and answers all of
    them: every answer comes from a probe that began after its request arrived (so a
    client that has just written sees its write), and 50 concurrent clients of one
    contract cost a few round trips per millisecond, not one each.
    """

    def __init__(self, connect: Callable[[], Awaitable[Any]], connections: int = 2) -> None:
        self._connect = connect
        self._connections = connections
        self._loops: dict[asyncio.AbstractEventLoop, _LoopProbes] = {}
        self._guard = threading.Lock()
        #: Probes sent to the server so far (each answers every request it started for).
        self.round_trips = 0

    def start(self) -> None:
        """Serve probes in the running loop."""
        loop = asyncio.get_running_loop()
        with self._guard:
            self._loops.setdefault(loop, _LoopProbes(self._connections))

    async def stop(self) -> None:
        """Close the running loop's connections."""
        loop = asyncio.get_running_loop()
        with self._guard:
            mine = self._loops.pop(loop, None)
        if mine is None:
            return
        for task in list(mine.drivers.values()):
            task.cancel()
        for conn in mine.all:
            with contextlib.suppress(Exception):  # closing what may be broken already
                await conn.close()

    def serving(self) -> bool:
        """Whether the running loop was started."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return loop in self._loops

    async def state(self, scope: tuple[str, str], contract_id: str | None) -> State | None:
        """The contract's log state if a caller of ``scope`` may see it, else None
        (``contract_id`` None: the state of the caller's list of contracts)."""
        lp = self._loops.get(asyncio.get_running_loop())
        if lp is None:
            raise LookupError("no probe connections in this event loop")
        key = (scope[0], scope[1], contract_id)
        fut: asyncio.Future[State | None] = asyncio.get_running_loop().create_future()
        lp.waiting.setdefault(key, []).append(fut)
        if key not in lp.drivers:
            lp.drivers[key] = asyncio.get_running_loop().create_task(self._drive(lp, key))
        return await fut

    async def _drive(self, lp: _LoopProbes, key: _Key) -> None:
        """Probe ``key`` for everyone waiting when the probe starts, again while more
        arrived meanwhile."""
        try:
            while True:
                batch = lp.waiting.pop(key, None)
                if not batch:
                    return
                try:
                    result: State | BaseException | None = await self._probe(lp, key)
                except Exception as exc:
                    result = exc
                for fut in batch:
                    if fut.done():
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            lp.drivers.pop(key, None)
            for fut in lp.waiting.pop(key, []):  # cancelled meanwhile: nobody probes
                if not fut.done():
                    fut.set_exception(LookupError("probe stopped"))

    async def _probe(self, lp: _LoopProbes, key: _Key) -> State | None:
        import psycopg

        if lp.idle.empty() and lp.made < lp.limit:
            lp.made += 1
            try:
                conn = await self._connect()
            except BaseException:
                lp.made -= 1
                raise
            lp.all.append(conn)
        else:
            conn = await lp.idle.get()
        sql, params = probe_statement((key[0], key[1]), key[2])
        self.round_trips += 1
        try:
            async with psycopg.AsyncClientCursor(conn) as cur:
                await cur.execute(sql, params)
                cur.nextset()
                row = await cur.fetchone()
        except BaseException:
            # whatever broke, this connection is not reused
            lp.made -= 1
            lp.all.remove(conn)
            with contextlib.suppress(Exception):  # already broken
                await conn.close()
            raise
        lp.idle.put_nowait(conn)
        return probe_state(row, key[2])


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), as Starlette reads it."""
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class FastLane:
    """Replays declared answers of ``/api/v1`` GETs (see the module's docstring)."""

    def __init__(self, app: Any, portal: Portal) -> None:
        self.app = app
        self.portal = portal
        self._warned = -1e9

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not scope["path"].startswith(PREFIX)
            or not self.portal.probes.serving()
        ):
            await self.app(scope, receive, send)
            return
        portal = self.portal
        target = (scope.get("raw_path") or scope["path"].encode(), scope["query_string"])
        inm = _header(scope, b"if-none-match")
        try:
            if await self._replayed(scope, target, inm, send):
                return
        except Exception:  # the probe's connection broke, or worse: the usual way
            now = time.monotonic()
            if now - self._warned > 60:  # once a minute, not once per request
                self._warned = now
                log.warning("fast lane: answering %s the usual way", scope["path"],
                            exc_info=True)
        holder = Declaration()
        scope[SCOPE_KEY] = holder
        start: dict[str, Any] = {}
        parts: list[bytes] = []
        complete = False

        async def keep(message: Any) -> None:
            nonlocal complete
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                complete = not message.get("more_body", False)
            await send(message)

        await self.app(scope, receive, keep)
        status = start.get("status")
        if holder.at is not None and portal.settings.figures_ttl_seconds <= 0:
            return  # figures of this very microsecond: never asked for again
        if holder.set and complete and status in (200, 304) and holder.scope is not None:
            portal.replays.put(
                (holder.scope, *target, inm),
                Kept(holder.state, holder.at, int(status),
                     list(start.get("headers", [])), b"".join(parts)),
            )

    async def _replayed(
        self, scope: Any, target: tuple[bytes, bytes], inm: str | None, send: Any
    ) -> bool:
        """Answer from a kept answer if it is still exactly the answer; False if not."""
        from web.deps import SESSION_COOKIE, known_principal

        portal = self.portal
        path: str = scope["path"]
        if path in PUBLIC_PATHS:
            who_scope = PUBLIC
        else:
            if path != LIST and not path.startswith(CONTRACTS):
                return False
            cookie = None
            auth = _header(scope, b"authorization")
            if auth is None:
                raw = _header(scope, b"cookie")
                if raw:
                    from starlette.requests import cookie_parser

                    cookie = cookie_parser(raw).get(SESSION_COOKIE)
            who = known_principal(portal, auth, cookie)
            # the rule of web.deps.api_reader: someone known who may read
            if not isinstance(who, Principal) or not who.can_read:
                return False
            who_scope = scope_settings(who)
        kept = portal.replays.get((who_scope, *target, inm))
        if kept is None:
            return False
        if kept.at is not None and kept.at != portal.figures_now():
            return False
        if kept.state is not None or who_scope is not PUBLIC:
            contract_id = None if path == LIST else path[len(CONTRACTS):].split("/", 1)[0]
            if contract_id == "":
                return False
            state = await portal.probes.state(who_scope, contract_id)
            if state is None or state != kept.state:
                return False
        portal.replays.hits += 1
        await send({"type": "http.response.start", "status": kept.status,
                    "headers": kept.headers})
        await send({"type": "http.response.body", "body": kept.body})
        return True
