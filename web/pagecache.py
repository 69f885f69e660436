"""Rendered pages and JSON bodies of a contract year, reused while nothing they show changed.

A key always holds, in this order: what was rendered (``"dashboard"``, ``"failures"``,
``"api-failures"``…), the caller's tenant scope (the ``yoco.customer`` / ``yoco.scope``
pair its transactions run under, see :func:`web.db.scope_settings`), the contract, the
contract year, the size of the contract's log and the time the year's figures were
computed at (:func:`view_stamp`), then the normalised query.  So:

- one customer never gets another's entry (the scope differs; and every request first
  passes the scoped visibility query, which answers 404 for another customer's contract);
- a new ledger record changes the log size, hence the key: the next request renders anew;
- a recomputed year view (after the figures TTL) changes the stamp.

What is cached is the part of a page that depends on those only, never the header (who
is logged in, their CSRF token): that is rendered per request around the cached body.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from web.accounts import Principal
from web.db import scope_settings
from web.views import YearView

T = TypeVar("T")


def scope_key(principal: Principal) -> tuple[str, str]:
    """The tenant scope a principal reads under: (customer, ``all`` for staff)."""
    return scope_settings(principal)


def view_stamp(view: YearView) -> tuple[str, int, int, float]:
    """What identifies the content of a year view: contract, year, log size, computed at."""
    return (view.contract.contract_id, view.year, view.log_size, view.now.timestamp())


class PageCache:
    """A bounded, least-recently-used map from keys to rendered bodies (thread-safe)."""

    def __init__(self, max_entries: int = 2048) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._making: dict[Hashable, threading.Event] = {}
        self.hits = 0
        self.misses = 0

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        """The body cached under ``key``, else ``make()`` (stored, and returned).

        Made once per key: a thread that finds another making the same key waits for
        it rather than making it again (an SLA year over a large log is costly).
        """
        if self.max_entries <= 0:
            return make()
        with self._lock:
            try:
                value: T = self._entries[key]
            except KeyError:
                pass
            else:
                self._entries.move_to_end(key)
                self.hits += 1
                return value
            running = self._making.get(key)
            if running is None:
                self._making[key] = threading.Event()
        if running is not None:
            running.wait()
            with self._lock:
                if key in self._entries:
                    self.hits += 1
                    return self._entries[key]
            return self.get_or_make(key, make)  # the maker failed: try ourselves
        try:
            value = make()
            with self._lock:
                self.misses += 1
                self._entries[key] = value
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        finally:
            with self._lock:
                self._making.pop(key).set()
        return value

    def peek(self, key: Hashable) -> Any:
        """The value cached under ``key``, or None (nothing is made)."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return value

    def making(self, key: Hashable) -> bool:
        """Whether some thread is making ``key`` now."""
        with self._lock:
            return key in self._making

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s entry, if any."""
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
