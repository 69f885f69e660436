"""The portal wired to the composition root.

``web`` takes what it needs of the deployment as a :class:`web.portal.Host` parameter and
never imports ``yoco``; this module is where the two meet.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

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
