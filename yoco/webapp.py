"""The portal wired to the composition root.

``web`` takes what it needs of the deployment as a :class:`web.portal.Host` parameter and
never imports ``yoco``; this module is where the two meet.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from uvicorn.supervisors.multiprocess import Process as _UvicornProcess

from yoco.app import App

if TYPE_CHECKING:
    from argon2 import PasswordHasher
    from fastapi import FastAPI

    from web.settings import WebSettings


def portal_app(
    ctx: App | None = None,
    settings: WebSettings | None = None,
    *,
    hasher: PasswordHasher | None = None,
    clock: Callable[[], datetime] | None = None,
) -> FastAPI:
    """The portal and API (:func:`web.app.create_app`) on ``ctx`` (default: a new
    :class:`App` from the environment)."""
    from web.app import create_app

    return create_app(ctx or App(), settings, hasher=hasher, clock=clock)


def app_from_environment() -> FastAPI:
    """The portal built from the environment alone (``yoco serve --workers N``'s factory)."""
    return portal_app()


def serve_workers(workers: int, options: dict[str, Any]) -> None:
    """Run ``workers`` uvicorn worker processes of :func:`app_from_environment` on
    ``options["host"]:options["port"]``, each with its **own** listening socket
    (``SO_REUSEPORT``), so the kernel spreads new connections evenly over them.

    uvicorn's own ``--workers`` shares one listening socket: the worker that wakes first
    accepts a burst of connections (most keep-alive clients in one worker:
    docs/benchmarks-portal.md, "Figures behind the code"), and with keep-alive that split
    lasts as long as the connections.
    Here the supervisor (uvicorn's, which restarts a worker that dies and stops them
    gracefully) holds a socket bound with ``SO_REUSEPORT`` but never listening, which
    only reserves the address; each worker binds its own socket to it and listens.
    """
    import socket

    import uvicorn
    from uvicorn.supervisors import multiprocess

    config = uvicorn.Config("yoco.webapp:app_from_environment", factory=True,
                            workers=workers, **options)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    sock.set_inheritable(True)
    # Worker processes are made by the supervisor through this module-level name.
    multiprocess.Process = _OwnSocketProcess  # type: ignore[misc]
    try:
        multiprocess.Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()


def _own_socket(reserved: Any, backlog: int) -> Any:
    """A new listening socket on the address of ``reserved`` (``SO_REUSEPORT``)."""
    import socket

    own = socket.socket(reserved.family, socket.SOCK_STREAM)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    own.bind(reserved.getsockname()[:2])
    own.listen(backlog)
    reserved.close()
    return own


class _OwnSocketProcess(_UvicornProcess):
    """A uvicorn worker that serves its own ``SO_REUSEPORT`` socket instead of the
    supervisor's (see :func:`serve_workers`)."""

    def target(self, sockets: list[Any] | None = None) -> None:  # pragma: no cover
        own = [_own_socket(s, self.config.backlog) for s in sockets or []]
        super().target(own)
