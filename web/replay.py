"""What the fast lane (:mod:`web.fastlane`) keeps and how it checks it: the handlers'
declarations (:func:`declare`, :func:`body_kept`), the kept answer (:class:`Kept`, in the
``replays`` region of the portal's one cache, :mod:`web.cache`) and the visibility probe
in the event loop (:class:`AsyncProbe`, shared by concurrent requests).

A body is kept once: an answer whose handler kept its body in a region of the cache
(:func:`body_kept`: the API's bodies under their tag in ``pages``, the ``/sla`` figures in
``figures``) is kept in ``replays`` as its status, headers and state, with a reference
to that very entry; only a body kept nowhere else (a 304's, the public key's) is held in
``replays`` itself.

Kept apart from the middleware so that the portal's context (:mod:`web.portal`) and the
routers can use them without importing the request dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from web.db import ListState, LogState, probe_state, probe_statement, scope_settings

if TYPE_CHECKING:
    from fastapi import Request

    from web.accounts import Principal
    from web.cache import Cache

State = LogState | ListState
T = TypeVar("T")

if TYPE_CHECKING:
    from fastapi import Request


#: Where a handler finds the declaration holder of its request (the ASGI scope key).
SCOPE_KEY = "yoco.fastlane"
#: The scope of answers that depend on no caller (the signer's public key).
PUBLIC: tuple[str, str] = ("\x00public", "")


@dataclass(slots=True)
class Declaration:
    """What a handler said its answer is a function of (see :func:`declare`)."""

    scope: tuple[str, str] | None = None
    state: State | None = None
    at: datetime | None = None
    set: bool = False
    #: Where the handler kept the answer's body (:func:`body_kept`): region and key.
    body: tuple[Cache, Hashable] | None = None


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


def body_kept(
    request: Request,
    region: Cache,
    key: Hashable,
    make: Callable[[], T],
    keep: Callable[[T], bool] | None = None,
) -> T:
    """``region.get_or_make(key, make, keep=keep)`` (:meth:`web.cache.Cache.get_or_make`),
    for a value that is the answer's body or a tuple holding it: the fast lane then
    keeps the answer with a reference to that entry instead of a second copy of the body
    (:class:`Kept`).  It checks that the body it sent is that very value, and at every
    replay that the entry is still the one it saw; else it holds the body itself, or
    lets the handler answer."""
    value = region.get_or_make(key, make, keep=keep)
    holder = request.scope.get(SCOPE_KEY)
    if isinstance(holder, Declaration):
        holder.body = (region, key)
    return value


#: Where a kept answer's body is: (region, key, the entry's serial number, the index of
#: the body in the entry's tuple, or None: the entry's value is the body).
Source = tuple["Cache", Hashable, int, int | None]


def source_of(region: Cache, key: Hashable, body: bytes) -> Source | None:
    """A reference to the entry of ``region`` under ``key`` when its value is the very
    object ``body`` or a tuple holding it; None when it is not kept there (the caller
    then holds the body itself)."""
    stamped = region.stamped(key)
    if stamped is None or not body:
        return None
    serial, value = stamped
    if value is body:
        return (region, key, serial, None)
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            if v is body:
                return (region, key, serial, i)
    return None


@dataclass(slots=True)
class Kept:
    """One kept answer and what it was made of.

    ``source``: where its body is kept (:func:`source_of`; ``body`` is then empty and
    only the status and headers weigh); None: ``body`` is the body.
    """

    state: State | None
    at: datetime | None
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    size: int = field(init=False)
    source: Source | None = None

    def __post_init__(self) -> None:
        self.size = len(self.body) + sum(len(k) + len(v) for k, v in self.headers) + 64

    def content(self) -> bytes | None:
        """The body to send: its own, or the value of the entry it refers to while that
        entry is the very one it was kept with (same serial number); None when that
        entry is gone or was made again (the handler answers)."""
        if self.source is None:
            return self.body
        region, key, serial, part = self.source
        stamped = region.stamped(key)
        if stamped is None or stamped[0] != serial:
            return None
        value = stamped[1] if part is None else stamped[1][part]
        return value if isinstance(value, bytes) else None


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
