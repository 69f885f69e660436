"""Logins and units of work: the one place that commits, the one check against superusers.

Every package's services take a :class:`~sqlalchemy.orm.Session` and never commit;
:func:`unit_of_work` commits what they did, or rolls all of it back. It lives here, at
the bottom of the import graph (``yoco → web → reports → billing → ledger``), so that
the composition root, the portal and the runtime's ledger sink all use the same one.

:func:`login_engine` is the one home of the rule "no process logs in as a superuser"
(DESIGN section 5): every connection of the application, the portal and the sink
switches to its role and refuses a superuser login with :class:`SuperuserLogin`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from ledger.errors import SuperuserLogin

__all__ = ["APP_ROLE", "PORTAL_ROLE", "SuperuserLogin", "login_engine", "unit_of_work"]

#: The writers' privileges (no login): INSERT/SELECT on the journal and projections,
#: state columns of four projections under a guard; BYPASSRLS (see
#: ``yoco.database.ROLES_SQL``).
APP_ROLE = "yoco_app"
#: The portal's tenant reads (no login): SELECT only, under row-level security.
PORTAL_ROLE = "yoco_portal"


def login_engine(
    url: str,
    *,
    role: str | None,
    refusal: Callable[[str], str],
    allow_superuser: bool = False,
    **kwargs: Any,
) -> Engine:
    """An engine on ``url`` whose every connection runs as ``role`` (None: the login's own).

    Each new connection asks the server whether its login (``session_user``) is a
    superuser and, unless ``allow_superuser``, closes it and raises
    :class:`SuperuserLogin` with the text ``refusal(login)``: the application never
    runs with the power to edit the ledger unnoticed.
    """
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _login(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            if role is not None:
                cur.execute(f"SET ROLE {role}")
            cur.execute("SELECT session_user, rolsuper FROM pg_roles WHERE rolname = session_user")
            user, superuser = cur.fetchone()
        dbapi_conn.commit()
        if superuser and not allow_superuser:
            dbapi_conn.close()
            raise SuperuserLogin(refusal(user))

    return engine


@contextmanager
def unit_of_work(bind: Engine | sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work is committed on success and rolled back on any error.

    ``bind`` is an engine or a ready session factory. Services take a session and never
    commit; this is the one place that does.
    """
    factory = bind if isinstance(bind, sessionmaker) else sessionmaker(
        bind=bind, expire_on_commit=False
    )
    session = factory()
    try:
        yield session
        session.commit()
    except Exception:
        session.rollback()
        raise
    except BaseException:
        # Ctrl-C (KeyboardInterrupt) or an exit may land in the middle of a command (a
        # COPY, a fetch): such a connection cannot roll back ("another command is already
        # in progress"), and trying would replace the interrupt with that error. Closing it
        # instead ends the transaction on the server just as surely: nothing is committed.
        session.invalidate()
        raise
    finally:
        session.close()
