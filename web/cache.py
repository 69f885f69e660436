"""The portal's one cache: what a worker process keeps between requests, under which key,
and when a kept value is no longer served.

Everything the portal keeps lives in one :class:`PortalCache` (``portal.cache``), made of
regions of one kind, :class:`Cache` (a bounded least-recently-used map in which each key
is made once at a time), that differ only in what they hold and how they are bounded:

============  =====================================================  =====================
region        holds                                                  bound (setting)
============  =====================================================  =====================
``views``     the year views (figures, months, failure rows) and     256 views, 1,024 memo
              their memo (terms in force, contract specs, forecasts)  entries
``pages``     rendered page bodies and API JSON bodies               ``PAGE_CACHE_ENTRIES``
``figures``   ``/sla`` answers (and the latest instant of each)       ``FIGURES_CACHE_ENTRIES``
``replays``   the API answers the fast lane replays: status, headers  ``REPLAY_CACHE_BYTES``
              and what they were made of, with a reference to their
              body in ``pages`` or ``figures``
``sessions``  live sessions, by session token                         10,000
``tokens``    live read tokens, by SHA-256 of the token               10,000
============  =====================================================  =====================

(settings are ``YOCO_WEB_…``; 0 turns a region of answers off.)

**A body is kept once.**  An API body is kept by its handler (under its tag, in
``pages``; the ``/sla`` figures in ``figures``), and the fast lane's answer refers to that
entry rather than copying it (:func:`web.replay.body_kept`, :class:`web.replay.Kept`):
the answer is replayed only while that very entry is kept (its serial number,
:meth:`Cache.stamped`), so when the body falls out of its region the handler answers
again.  Only a body kept nowhere else (a 304's, which is empty; the public key) is held
in ``replays`` itself.

**The rule.**  A kept value is a function of three things, and its key (or, for values
looked up before they are known, the value itself) names all three:

1. the **tenant scope** of the callers it may be served to (:func:`scope_key`: the
   ``yoco.customer`` / ``yoco.scope`` pair the caller's transactions run under).  Values
   that are a function of one contract's log alone (year views, terms, forecasts, metric
   samples) are keyed by the contract instead, and are reached only after the request's
   visibility probe, run as the caller under row-level security, has seen the contract;
2. the **state of the contract log** it was made from (:class:`web.db.LogState`: the log's
   size, the tree size of its latest signed checkpoint and its latest witness
   cosignature; for the contract list, :class:`web.db.ListState`), read afresh for every
   request by that probe, the request's first database round trip;
3. for figures that depend on the time, the **figures instant** (the time rounded down to
   ``YOCO_WEB_FIGURES_TTL_SECONDS``, :meth:`web.portal.Portal.figures_now`).

A value is served only to a request whose own (scope, log state, instant) equal the ones
it names.  Nothing is deleted when something changes: every ledger write grows the log
(every input of every figure is an entry of the contract's own log), signing adds a tree
head, a witness adds a cosignature: the next request's probe reads the new state, and no
value made from the old one matches it; old values fall out at the region's bound,
least recently used first.  The API's entity tags (:mod:`web.conditional`) hash the same
three things, so a tag and a kept body are named alike (many bodies are kept under their
tag).

**Bounds on staleness**, per worker process:

- a ledger write, a checkpoint, a cosignature: none for a request that begins after it
  committed -- except that while one request recomputes a year view whose log grew,
  concurrent requests of that year get the previous view, under the previous view's own
  tag (never a tag that names the new state): at most one computation;
- the time: figures are those of the instant, at most one TTL old; when only the
  instant moved on, the previous instant's answer (under its own tag) is served while
  the new one is computed in the background: at most one TTL plus one computation;
- a revoked token or an ended session: a caller the database said was live is trusted
  for ``YOCO_WEB_SESSION_CACHE_SECONDS`` (10 s) from that answer, and asked again in the
  background past half of it (a revoked one then ends early); so **a revoked read token
  is refused within 10 s** in every process.  Revoking a token or logging out through
  the portal ends it at once in the process that did it; ``POST /api/v1/records`` (any
  write) always asks the database, so a revoked token stops writing at once;
- another tenant: never (the scope is in every key and every check).

The principals are the one region not keyed by log state: their bound is the time above.
Figures: docs/benchmarks-portal.md.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from web.accounts import Principal
from web.db import scope_settings

if TYPE_CHECKING:
    from datetime import datetime

    from web.settings import WebSettings
    from web.views import YearView

T = TypeVar("T")
log = logging.getLogger("yoco.web")


def scope_key(principal: Principal) -> tuple[str, str]:
    """The tenant scope a principal reads under: (customer, ``all`` for staff)."""
    return scope_settings(principal)


def view_stamp(view: YearView) -> tuple[str, int, int, float]:
    """What identifies the content of a year view: contract, year, log size, computed at."""
    return (view.contract.contract_id, view.year, view.log_size, view.now.timestamp())


def _one(_value: Any) -> int:
    return 1


class Cache:
    """A region of the cache: a bounded, least-recently-used map (thread-safe) in which
    each key is made once at a time.

    ``limit`` bounds the total weight of the entries (``weigh(value)``, 1 each by
    default: a number of entries); ``limit <= 0`` keeps nothing.  A value heavier than
    the whole limit is not kept.  Every value kept gets a serial number never given
    before (:meth:`stamped`): whoever refers to an entry rather than copying its value
    (the fast lane's answers refer to the bodies their handlers kept) can tell the very
    value it saw from one made again under the same key.
    """

    def __init__(self, limit: int, weigh: Callable[[Any], int] | None = None) -> None:
        self.limit = limit
        self._weigh = weigh or _one
        #: key -> (weight, value, serial)
        self._entries: OrderedDict[Hashable, tuple[int, Any, int]] = OrderedDict()
        self._serials = itertools.count(1)
        self._weight = 0
        self._lock = threading.Lock()
        self._making: dict[Hashable, threading.Event] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any:
        """The value kept under ``key`` (now the most recently used), or None."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def stamped(self, key: Hashable) -> tuple[int, Any] | None:
        """The serial number and value kept under ``key`` (now the most recently used),
        or None."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[2], hit[1]

    @property
    def weight(self) -> int:
        """The total weight of the entries kept (their number, unless weighed)."""
        return self._weight

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` under ``key`` (replacing what was there); the least recently
        used entries go while the region is over its limit."""
        weight = self._weigh(value)
        if weight > self.limit:
            return
        with self._lock:
            self._put(key, value, weight)

    def _put(self, key: Hashable, value: Any, weight: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._weight -= old[0]
        self._entries[key] = (weight, value, next(self._serials))
        self._weight += weight
        while self._weight > self.limit:
            _, (w, _, _) = self._entries.popitem(last=False)
            self._weight -= w

    def get_or_make(
        self,
        key: Hashable,
        make: Callable[[], T],
        fresh: Callable[[T], bool] | None = None,
        keep: Callable[[T], bool] | None = None,
    ) -> T:
        """The value kept under ``key`` (when ``fresh(value)``, if given), else
        ``make()``, kept and returned.

        Made once per key: a thread that finds another making the same key waits for it
        and then looks again, rather than making it too (a year's figures are costly).
        ``keep``: a made value for which it is false is returned but not kept (it is not
        what the key names: the log grew while it was made), so a key never stands for
        another value, not even for a moment.
        """
        if self.limit <= 0:
            return make()
        while True:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None and (fresh is None or fresh(hit[1])):
                    self._entries.move_to_end(key)
                    self.hits += 1
                    value: T = hit[1]
                    return value
                running = self._making.get(key)
                if running is None:
                    self._making[key] = threading.Event()
                    break
            running.wait()  # then look again (the maker may have failed)
        try:
            value = make()
            weight = self._weigh(value)
            with self._lock:
                self.misses += 1
                if weight <= self.limit and (keep is None or keep(value)):
                    self._put(key, value, weight)
        finally:
            with self._lock:
                self._making.pop(key).set()
        return value

    def make_later(
        self,
        key: Hashable,
        make: Callable[[], Any],
        then: Callable[[Any], None] | None = None,
    ) -> bool:
        """Make ``key`` in a background thread unless some thread is making it now;
        ``make()`` returning None keeps nothing.  ``then(value)`` runs after the value is
        kept.  Returns whether a thread was started.  A failure is logged (the next
        request makes the key itself)."""
        if self.limit <= 0:
            return False
        with self._lock:
            if key in self._making:
                return False
            self._making[key] = threading.Event()

        def run() -> None:
            try:
                value = make()
                if value is not None:
                    self.put(key, value)
                    if then is not None:
                        then(value)
            except Exception:
                log.exception("making %r in the background failed", key)
            finally:
                with self._lock:
                    self._making.pop(key).set()

        threading.Thread(target=run, name="yoco-cache-refresh", daemon=True).start()
        return True

    def making(self, key: Hashable) -> bool:
        """Whether some thread is making ``key`` now."""
        with self._lock:
            return key in self._making

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s entry, if any."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[0]

    def kept(self) -> list[Hashable]:
        """The keys kept now, least recently used first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._entries)


class ViewCache:
    """Year views by (contract, year), served while the log is unchanged and they are
    younger than the figures TTL, and the memo of values named by a log size.

    A view that only aged (the log has not grown) is returned at once while it is
    recomputed in the background; while one thread recomputes a view whose log grew,
    others get the previous one instead of queueing behind it (the rule's first bound).
    """

    def __init__(self, ttl_seconds: float, max_entries: int = 256) -> None:
        self.ttl = ttl_seconds
        self.max_entries = max_entries
        #: (contract, year) -> (when made, monotonic seconds; the view).
        self.views = Cache(max_entries)
        #: Values that never change for their key (keys carry the log size).
        self.memos = Cache(4 * max_entries)

    def get(
        self,
        key: tuple[str, int],
        size: int,
        compute: Callable[[], YearView],
        refresh: Callable[[YearView], YearView] | None = None,
        not_before: datetime | None = None,
    ) -> YearView:
        """The cached view of ``key`` if fresh, else one computed now (once, not per caller).

        When only the TTL has run out (the log has not grown) and ``refresh`` is given,
        the cached view is returned at once and ``refresh(view)`` recomputes it in a
        background thread: no request waits for figures that merely aged.
        ``not_before``: a view computed at an earlier time has aged too (the API's
        figures instant moved on).
        """

        def ok(entry: tuple[float, YearView]) -> bool:
            return self._fresh(entry, size, not_before)

        cached: tuple[float, YearView] | None = self.views.get(key)
        if cached is not None and ok(cached):
            return cached[1]
        if cached is not None:
            old = cached[1]
            if (refresh is not None and self.ttl > 0 and old.log_size == size
                    and old.records is not None):
                self.views.make_later(key, lambda: self._refreshed(key, old, refresh))
                return old
            if self.views.making(key):
                return old  # someone is recomputing: the previous view meanwhile
        entry = self.views.get_or_make(key, lambda: (time.monotonic(), _settled(compute())),
                                       fresh=ok)
        return entry[1]

    def _refreshed(
        self, key: tuple[str, int], old: YearView, refresh: Callable[[YearView], YearView]
    ) -> tuple[float, YearView] | None:
        view = refresh(old)
        current = self.views.get(key)
        if current is not None and current[1].log_size > view.log_size:
            return None  # a view of a grown log came meanwhile: keep that one
        return time.monotonic(), _settled(view)

    def peek(
        self, key: tuple[str, int], size: int, not_before: datetime | None = None
    ) -> YearView | None:
        """The cached view of ``key`` if it is fresh for a log of ``size`` (and computed
        at ``not_before`` or later, when given), else None."""
        cached = self.views.get(key)
        if cached is not None and self._fresh(cached, size, not_before):
            view: YearView = cached[1]
            return view
        return None

    def peek_memo(self, key: tuple[Any, ...]) -> Any:
        """The memoised value of ``key``, or None."""
        return self.memos.get(key)

    def memo(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """A value that never changes for ``key`` (keys carry the log size), computed once."""
        return self.memos.get_or_make(key, compute)

    def _fresh(
        self, entry: tuple[float, YearView], size: int, not_before: datetime | None = None
    ) -> bool:
        at, view = entry
        return (
            view.log_size == size
            and time.monotonic() - at < self.ttl
            and (not_before is None or view.now >= not_before)
        )

    def clear(self) -> None:
        """Forget every view and memo."""
        self.views.clear()
        self.memos.clear()


def _settled(view: YearView) -> YearView:
    from web.views import settle

    settle()
    return view


class PrincipalCache:
    """Callers the database said were live, by session token or token hash: the
    principals' region (the rule's bound for a revoked token or an ended session).

    An entry's time is when the database last said the caller was live; it is served
    for ``ttl`` seconds from then.  Past half of that, :meth:`web.portal.Portal.recheck`
    asks again in the background, which renews a live one and ends one that is not.
    Logging out (or revoking through the portal) drops the entry at once in this process.
    """

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        #: The clock entries are timed by (monotonic seconds; tests move it on).
        self.clock = clock
        self._entries = Cache(10_000)

    def get(self, token: str) -> Principal | None:
        """The cached principal of ``token``, if the database said it was live less than
        ``ttl`` seconds ago."""
        hit = self.entry(token)
        return None if hit is None else hit[1]

    def entry(self, token: str) -> tuple[float, Principal] | None:
        """(when it was last checked, principal) of a live entry, else None."""
        hit: tuple[float, Principal] | None = self._entries.get(token)
        if hit is None or self.clock() - hit[0] > self.ttl:
            return None
        return hit

    def aging(self, checked: float) -> bool:
        """Whether an entry checked at ``checked`` is past half its ``ttl`` (time to
        check it again, before requests would have to wait for it)."""
        return self.clock() - checked > self.ttl / 2

    def renew(self, token: str, checked: float, who: Principal | None) -> None:
        """Replace the entry checked at ``checked`` by the result of a new check
        (``who``; None: no longer live, forget it) -- unless it changed meanwhile (a
        logout dropped it), when nothing is put back."""
        hit = self._entries.get(token)
        if hit is None or hit[0] != checked:
            return
        if who is None:
            self._entries.forget(token)
        else:
            self.put(token, who)

    def put(self, token: str, who: Principal, checked: float | None = None) -> None:
        """Remember a live caller, as checked now (or at ``checked``, on this cache's
        clock)."""
        if self.ttl <= 0:
            return
        self._entries.put(token, (self.clock() if checked is None else checked, who))

    def drop(self, token: str) -> None:
        """Forget a caller (logout, revocation)."""
        self._entries.forget(token)

    def clear(self) -> None:
        """Forget every caller (each is asked of the database again)."""
        self._entries.clear()


def _kept_size(kept: Any) -> int:
    size: int = kept.size
    return size


class PortalCache:
    """Every region of the portal's one cache (see the module's docstring for the rule)."""

    def __init__(self, settings: WebSettings) -> None:
        self.views = ViewCache(settings.figures_ttl_seconds)
        #: Rendered page bodies and API JSON bodies (keys: kind, scope, stamp or tag).
        self.pages = Cache(settings.page_cache_entries)
        #: ``/sla`` answers by (contract, period, log size, instant): computed once each.
        self.figures = Cache(settings.figures_cache_entries)
        #: The latest instant each ``/sla`` answer (by contract, period and log size) was
        #: computed at (``web.routers.api_contracts._previous_sla``).
        self.instants = Cache(4096)
        #: API answers their handlers declared replayable (``web.fastlane``), weighed
        #: by their bytes; each is checked against the request's state at use.  A body
        #: kept by its handler in ``pages`` or ``figures`` is not kept here again.
        self.replays = Cache(settings.replay_cache_bytes, weigh=_kept_size)
        #: When the fast lane last logged answering the usual way (monotonic seconds).
        self.replay_warned_at = -1e9
        self.sessions = PrincipalCache(settings.session_cache_seconds)
        #: Read tokens by SHA-256 (reads only: a write always asks the database).
        self.tokens = PrincipalCache(settings.session_cache_seconds)

    def clear(self) -> None:
        """Forget everything kept (as in a fresh worker)."""
        self.views.clear()
        for region in (self.pages, self.figures, self.instants, self.replays):
            region.clear()
        self.sessions.clear()
        self.tokens.clear()
