"""The portal's context: its :class:`Host` (given by the composition root), engines, secrets.

One :class:`Portal` per FastAPI application, built by :func:`web.app.create_app` and
kept in ``app.state.portal``; its engines are created on first use.

``web`` never imports the composition root (``yoco``): imports point one way,
``yoco → web → reports → billing → ledger``. What the portal needs of the deployment
(where its data lives, its database login, the checkpoint signer, the projectors wired
into ingest) comes in as a :class:`Host`; ``yoco.app.App`` is one
(``yoco.webapp.portal_app`` passes it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from argon2 import PasswordHasher
from fastapi.templating import Jinja2Templates

from ledger.errors import InvariantBroken
from web import filters
from web.accounts import Principal
from web.cache import PortalCache, PrincipalCache
from web.cursors import CursorCodec
from web.db import PortalDb, app_engine, portal_engine, probe_connection, probe_engine
from web.replay import AsyncProbe
from web.security import CookieSigner, password_hasher
from web.settings import WebSettings, resolve_secret

if TYPE_CHECKING:
    from ledger.note import Signer
    from ledger.projections import Projector

HERE = Path(__file__).resolve().parent


class HostSettings(Protocol):
    """The deployment's settings the portal reads."""

    @property
    def data_dir(self) -> Path:
        """Where keys live (the cookie secret is kept under ``keys/``)."""
        ...

    @property
    def log_origin(self) -> str:
        """The origin line of signed checkpoints (prefix of each log's origin)."""
        ...

    @property
    def checkpoint_every_s(self) -> int:
        """Seconds within which every log with new entries gets a signed checkpoint."""
        ...


class HostDatabase(Protocol):
    """The database the portal logs in to."""

    @property
    def portal_url(self) -> str:
        """The portal's own login (``yoco_web``, never a superuser)."""
        ...


class Host(Protocol):
    """What the portal takes from the composition root, by parameter.

    ``yoco.app.App`` is one. ``database`` may start a server on first use, so the
    portal reads it only when it first needs an engine.
    """

    @property
    def settings(self) -> HostSettings:
        """The deployment's settings."""
        ...

    @property
    def database(self) -> HostDatabase:
        """The database in use."""
        ...

    @property
    def signer(self) -> Signer:
        """The checkpoint signer (operators sign tree heads from the portal)."""
        ...

    @property
    def projectors(self) -> Sequence[Projector]:
        """Projectors of packages above the ledger, wired into ingest."""
        ...

    def close(self) -> None:
        """Release what the host holds (called when the portal shuts down)."""
        ...


class Portal:
    """Everything a request handler needs, created lazily and shared by all requests."""

    def __init__(
        self,
        host: Host,
        settings: WebSettings,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.host = host
        self.settings = settings
        self.hasher = hasher or password_hasher()
        #: Everything kept between requests, in one place under one rule (``web.cache``).
        self.cache = PortalCache(settings)
        self._rechecking: set[str] = set()
        self._recheck_lock = threading.Lock()
        #: The visibility probe in the event loop, for the fast lane.
        self.probes = AsyncProbe(self._probe_connection, settings.probe_connections)
        self._lock = threading.Lock()
        self._clock = clock

    def recheck(
        self, cache: PrincipalCache, key: str, checked: float,
        lookup: Callable[[], Principal | None],
    ) -> None:
        """Ask the database again, in the background, whether the entry ``key`` of
        ``cache`` (checked at ``checked``) is live (``lookup``), and renew or end it
        (:meth:`web.cache.PrincipalCache.renew`).  Once per key at a time; a failed check leaves the
        entry to expire at its TTL."""
        with self._recheck_lock:
            if key in self._rechecking:
                return
            self._rechecking.add(key)

        def run() -> None:
            try:
                cache.renew(key, checked, lookup())
            except Exception:
                import logging

                logging.getLogger("yoco.web").warning("rechecking a session failed",
                                                      exc_info=True)
            finally:
                with self._recheck_lock:
                    self._rechecking.discard(key)

        self._checker.submit(run)

    @cached_property
    def _checker(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="yoco-recheck")

    def now(self) -> datetime:
        """The current time (a fixed clock in tests)."""
        return self._clock() if self._clock else datetime.now(UTC)

    @cached_property
    def secret(self) -> bytes:
        """The cookie and CSRF secret."""
        return resolve_secret(self.settings, self.host.settings.data_dir)

    def figures_now(self) -> datetime:
        """The instant the API computes time-dependent figures at: :meth:`now` rounded
        down to the figures TTL, the same in every worker (:mod:`web.conditional`)."""
        from web.conditional import figures_instant

        return figures_instant(self.now(), self.settings.figures_ttl_seconds)

    @cached_property
    def tag_key(self) -> bytes:
        """The key of the API's entity tags (derived from the secret)."""
        import hashlib

        return hashlib.sha256(b"yoco-api-etag\x00" + self.secret).digest()

    def etag(self, *parts: object) -> str:
        """A strong entity tag for an answer determined by ``parts`` (:func:`make_etag`)."""
        from web.conditional import make_etag

        return make_etag(self.tag_key, *parts)

    @cached_property
    def cursors(self) -> CursorCodec:
        """Signs and checks the API's pagination cursors."""
        from web.cursors import CursorCodec

        return CursorCodec(self.secret)

    @cached_property
    def signer(self) -> CookieSigner:
        """Signs cookies and derives CSRF tokens."""
        return CookieSigner(self.secret)

    @cached_property
    def db(self) -> PortalDb:
        """The portal role's and the application role's engines."""
        with self._lock:
            # The portal's own login (yoco_web, no superuser): writes as yoco_app, tenant
            # reads as yoco_portal.
            url = self.host.database.portal_url
            return PortalDb(
                app_engine(url),
                portal_engine(
                    url, pool_size=self.settings.pool_size, max_overflow=self.settings.max_overflow
                ),
                # The probe holds a connection for one round trip: a few suffice (and
                # PostgreSQL's 100 connections are shared by every worker).
                probe_engine(url, pool_size=min(4, self.settings.pool_size), max_overflow=0),
            )

    async def _probe_connection(self) -> object:
        from starlette.concurrency import run_in_threadpool

        # The engines (and the embedded server) may start on first use: not in the loop.
        db: PortalDb | None = self.__dict__.get("db")
        if db is None:
            db = await run_in_threadpool(lambda: self.db)
        if db.probe_engine is None:
            raise InvariantBroken("the portal's probe engine is not set up")
        return await probe_connection(db.probe_engine)

    @cached_property
    def templates(self) -> Jinja2Templates:
        """The page templates (``web/templates``)."""
        from jinja2 import Environment, FileSystemLoader, select_autoescape

        # auto_reload off: no stat() of every template file on every render
        env = Environment(
            loader=FileSystemLoader(str(HERE / "templates")),
            autoescape=select_autoescape(),
            auto_reload=False,
        )
        templates = Jinja2Templates(env=env)
        filters.install(templates.env)
        return templates

    @cached_property
    def verifier_key(self) -> str:
        """The checkpoint signer's verifier key (C2SP note verifier key)."""
        return self.host.signer.verifier_text()

    @property
    def projectors(self) -> Sequence[Projector]:
        """The host's projectors, wired into ingest (``POST /api/v1/records``)."""
        return self.host.projectors

    def close(self) -> None:
        """Release connections."""
        if "_checker" in self.__dict__:
            self._checker.shutdown(wait=True)
            del self.__dict__["_checker"]
        if "db" in self.__dict__:
            self.db.dispose()
        self.host.close()
