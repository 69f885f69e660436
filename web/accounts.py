"""Users, login sessions, API tokens and login limits (the application role's tables).

Services take a session and never commit; the caller's unit of work does.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from argon2 import PasswordHasher
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from ledger.contracts import contract_ids_of, customer_has_contracts, existing_contract_ids
from ledger.errors import ensure
from web.errors import Forbidden, Invalid, RateLimited
from web.models import ROLES, ApiToken, PortalSession, PortalUser
from web.security import hash_password, new_api_token, same_hash, sha256, token_prefix
from web.security import verify_password as _verify

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+")
MIN_PASSWORD = 10
#: What a token may be given besides reading a customer's data and posting records.
TOKEN_SCOPES = ("metrics",)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a logged-in user or an API token, and what they may see.

    ``customer`` is the tenant a customer user (or a read token) is bound to; staff
    (operators and finance) have none and see every customer.  ``contract_ids`` are the
    contracts a token may post records for.
    """

    kind: str
    id: int
    name: str
    role: str
    customer: str | None
    contract_ids: frozenset[str] = frozenset()
    session_binding: str | None = None
    #: A token's extra scopes (:data:`TOKEN_SCOPES`); users have none.
    scopes: frozenset[str] = frozenset()
    #: A customer user who manages their own customer's API tokens (``/account/tokens``).
    customer_admin: bool = False

    @property
    def is_staff(self) -> bool:
        """Operators and finance see all customers."""
        return self.role in ("operator", "finance")

    @property
    def can_read(self) -> bool:
        """May read tenant data: a user, or a token bound to a customer."""
        return self.kind == "user" or self.customer is not None


def principal_of_user(user: PortalUser, binding: str | None = None) -> Principal:
    """The principal of a logged-in user."""
    return Principal(
        kind="user",
        id=user.id,
        name=user.name,
        role=user.role,
        customer=user.customer if user.role == "customer" else None,
        session_binding=binding,
        customer_admin=bool(user.customer_admin) and user.role == "customer",
    )


def check_user_fields(*, email: str, role: str, customer: str | None) -> str:
    """The normalised e-mail of a user to create, or :class:`Invalid` naming what is wrong
    with its e-mail, role or customer (checked before a password is asked for)."""
    email = email.strip().lower()
    if not _EMAIL.fullmatch(email):
        raise Invalid(f"{email!r} is not an e-mail address")
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}")
    if role == "customer" and not (customer and customer.strip()):
        raise Invalid("a customer user needs --customer")
    if role != "customer" and customer:
        raise Invalid(f"an {role} user belongs to no customer (drop --customer)")
    return email


def add_user(
    session: Session,
    hasher: PasswordHasher,
    *,
    email: str,
    name: str,
    role: str,
    password: str,
    customer: str | None = None,
    customer_admin: bool = False,
) -> PortalUser:
    """Create a user (refusing a bad e-mail, role, short password or a taken e-mail).
    ``customer_admin``: a customer user who manages their customer's API tokens."""
    email = check_user_fields(email=email, role=role, customer=customer)
    if customer_admin and role != "customer":
        raise Invalid("only a customer user can be their customer's admin (--customer-admin)")
    if len(password) < MIN_PASSWORD:
        raise Invalid(f"the password must have at least {MIN_PASSWORD} characters")
    if session.execute(select(PortalUser.id).where(PortalUser.email == email)).first():
        raise Invalid(f"a user with e-mail {email} already exists")
    user = PortalUser(
        email=email,
        name=name.strip() or email,
        role=role,
        customer=customer.strip() if customer else None,
        password_hash=hash_password(hasher, password),
        customer_admin=customer_admin,
    )
    session.add(user)
    session.flush()
    return user


def customer_exists(session: Session, customer: str) -> bool:
    """True when some contract belongs to ``customer`` (read as the application role)."""
    return customer_has_contracts(session, customer)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoginLimits:
    """How many failed logins each key allows before it backs off.

    ``per_pair``: an account at one client address (the real user at their own client
    is not locked out by someone guessing elsewhere); ``per_address``: a client over all
    accounts (password spraying); ``per_account``: an account over all clients (a
    distributed guess), set well above ``per_pair``.  Past a limit the key is blocked
    for ``backoff``, doubled at every further failure, at most ``window``; a key quiet
    for a whole ``window`` (after its last failure and the end of its last block) starts
    again from zero.
    """

    per_pair: int
    per_address: int
    per_account: int
    window: timedelta
    backoff: timedelta

    def keys(self, email: str, address: str) -> dict[str, int]:
        """The keys an attempt counts under, with their limits."""
        return {
            f"pair:{email}|{address}": self.per_pair,
            f"addr:{address}": self.per_address,
            f"acct:{email}": self.per_account,
        }


# ``n``: the key's count with this attempt (from 1 again after a quiet window).  Run
# with the rows already locked (FOR UPDATE, in key order) by the same transaction.
_CLAIM = text(
    """
    UPDATE login_limits AS l SET
        failures = v.n,
        last_at = :now,
        blocked_until = CASE WHEN v.n >= v.lim
            THEN :now + make_interval(secs => least(
                :cap, :backoff * power(2, least(v.n - v.lim, 40))))
            ELSE NULL END
    FROM (
        SELECT k.key, k.lim,
               CASE WHEN coalesce(x.blocked_until, x.last_at) <= :since THEN 1
                    ELSE x.failures + 1 END AS n
        FROM (SELECT unnest(CAST(:keys AS text[])) AS key,
                     unnest(CAST(:limits AS integer[])) AS lim) AS k
        JOIN login_limits AS x ON x.key = k.key
    ) AS v
    WHERE l.key = v.key AND (l.blocked_until IS NULL OR l.blocked_until <= :now)
    RETURNING l.key
    """
)


def claim_attempt(
    session: Session, keys: dict[str, int], *, now: datetime, window: timedelta,
    backoff: timedelta,
) -> None:
    """Count one login attempt under every key, or raise :class:`RateLimited`.

    Atomic under concurrency: the keys' rows are locked (in key order, so two attempts
    never wait on each other crosswise) and counted by one ``UPDATE … RETURNING`` before
    any password is checked; the caller commits at once.  When any key is blocked,
    nothing is counted (the caller rolls back) and the error says when to retry.
    """
    names = sorted(keys)
    for _ in range(3):  # a row deleted as stale between the insert and the lock: again
        session.execute(
            text(
                "INSERT INTO login_limits (key, failures, last_at) "
                "SELECT k, 0, :now FROM unnest(CAST(:keys AS text[])) AS k ORDER BY k "
                "ON CONFLICT (key) DO NOTHING"
            ),
            {"keys": names, "now": now},
        )
        rows = session.execute(
            text(
                "SELECT key, blocked_until FROM login_limits WHERE key = ANY(:keys) "
                "ORDER BY key FOR UPDATE"
            ),
            {"keys": names},
        ).all()
        if len(rows) == len(names):
            break
    else:  # pragma: no cover - three races in a row with the stale-row cleanup
        raise RateLimited(1)
    blocked = [b for _, b in rows if b is not None and b > now]
    if blocked:
        raise RateLimited(int((max(blocked) - now).total_seconds()) + 1)
    claimed = session.execute(
        _CLAIM,
        {
            "keys": names,
            "limits": [keys[k] for k in names],
            "now": now,
            "since": now - window,
            "cap": window.total_seconds(),
            "backoff": backoff.total_seconds(),
        },
    ).scalars().all()
    ensure(len(claimed) == len(names), "rows locked and unblocked, yet not all counted")


def release_attempt(session: Session, keys: dict[str, int], *, now: datetime) -> None:
    """Uncount a successful attempt: its account at this client starts afresh, and the
    client's and the account's counts lose the attempt they had claimed."""
    pair = next(k for k in keys if k.startswith("pair:"))
    session.execute(text("DELETE FROM login_limits WHERE key = :k"), {"k": pair})
    others = sorted(k for k in keys if k != pair)
    session.execute(
        text(
            """
            UPDATE login_limits AS l SET
                failures = greatest(l.failures - 1, 0),
                blocked_until = CASE WHEN l.failures - 1 < v.lim THEN NULL
                                     ELSE l.blocked_until END
            FROM (SELECT unnest(CAST(:keys AS text[])) AS key,
                         unnest(CAST(:limits AS integer[])) AS lim) AS v
            WHERE l.key = v.key
            """
        ),
        {"keys": others, "limits": [keys[k] for k in others]},
    )


def forget_quiet_keys(session: Session, *, now: datetime, window: timedelta) -> None:
    """Drop up to 100 keys quiet for a whole window (so guessed e-mails do not pile up)."""
    session.execute(
        text(
            "DELETE FROM login_limits WHERE key IN (SELECT key FROM login_limits "
            "WHERE coalesce(blocked_until, last_at) <= :since "
            "LIMIT 100)"
        ),
        {"since": now - window},
    )


def authenticate(
    unit: Callable[[], AbstractContextManager[Session]],
    hasher: PasswordHasher,
    *,
    email: str,
    password: str,
    address: str,
    limits: LoginLimits,
    hours: float,
    now: datetime | None = None,
) -> str | None:
    """Check e-mail and password and open a session: its token, or None (a failure).

    Raises :class:`RateLimited` before checking anything when a key of the attempt
    (the account at this client, the client, the account anywhere) is blocked.  Three
    units of work from ``unit``: the attempt is claimed and committed first (so no
    row lock is held while argon2 runs), then the password is checked and, when right,
    the claim released and the session opened.  An unknown e-mail costs the same
    argon2 work as a wrong password, so timing does not tell them apart.
    """
    now = now or datetime.now(UTC)
    email = email.strip().lower()[:320]
    keys = limits.keys(email, address)
    with unit() as session:
        claim_attempt(session, keys, now=now, window=limits.window, backoff=limits.backoff)
    with unit() as session:
        user = session.execute(
            select(PortalUser).where(PortalUser.email == email)
        ).scalar_one_or_none()
        ok = _verify(hasher, user.password_hash if user else None, password)
        if not ok or user is None or user.disabled:
            forget_quiet_keys(session, now=now, window=limits.window)
            return None
        release_attempt(session, keys, now=now)
        if hasher.check_needs_rehash(user.password_hash):
            user.password_hash = hash_password(hasher, password)
        return open_session(session, user, hours)


def open_session(session: Session, user: PortalUser, hours: float) -> str:
    """Start a login session for ``user``; returns its token (only its hash is stored)."""
    token = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    session.add(
        PortalSession(
            token_hash=sha256(token),
            user_id=user.id,
            created_at=now,
            expires_at=now + timedelta(hours=hours),
        )
    )
    session.execute(delete(PortalSession).where(PortalSession.expires_at < now))
    session.flush()
    return token


def session_user(session: Session, token: str) -> PortalUser | None:
    """The enabled user of a live session token, or None."""
    return session.execute(
        select(PortalUser)
        .join(PortalSession, PortalSession.user_id == PortalUser.id)
        .where(
            PortalSession.token_hash == sha256(token),
            PortalSession.expires_at > func.now(),
            PortalUser.disabled.is_(False),
        )
    ).scalar_one_or_none()


def close_session(session: Session, token: str) -> None:
    """End a login session (logging out)."""
    session.execute(delete(PortalSession).where(PortalSession.token_hash == sha256(token)))


@dataclass(frozen=True, slots=True)
class CreatedToken:
    """A new token: its row and its text, which is shown once and never stored."""

    row: ApiToken
    text: str


def create_token(
    session: Session,
    *,
    name: str,
    contract_ids: list[str] | None = None,
    customer: str | None = None,
    scopes: list[str] | None = None,
) -> CreatedToken:
    """Create a token that may post records for ``contract_ids`` and/or read ``customer``'s data.

    Every contract named must exist.  ``scopes``: what else it may do, among
    :data:`TOKEN_SCOPES` (``metrics``: scrape ``/metrics``; a token with only that scope
    reads nothing else). A scope never widens the token's tenant: a metrics token with a
    customer or contracts scrapes only those (:func:`web.routers.metrics.scrape_scope`).
    """
    ids = sorted(set(contract_ids or []))
    wanted = sorted(set(scopes or []))
    unknown = [x for x in wanted if x not in TOKEN_SCOPES]
    if unknown:
        raise Invalid(f"unknown scope(s): {', '.join(unknown)} (known: {', '.join(TOKEN_SCOPES)})")
    if not ids and not customer and not wanted:
        raise Invalid(
            "a token needs --contract (to post records), --customer (to read) "
            "or --scope metrics (to scrape /metrics)"
        )
    if ids:
        found = existing_contract_ids(session, ids)
        missing = [c for c in ids if c not in found]
        if missing:
            raise Invalid(f"unknown contract(s): {', '.join(missing)}")
    new = new_api_token()
    row = ApiToken(
        prefix=new.prefix,
        secret_hash=new.secret_hash,
        name=name.strip() or new.prefix,
        customer=customer.strip() if customer else None,
        contract_ids=ids,
        scopes=wanted,
    )
    session.add(row)
    session.flush()
    return CreatedToken(row=row, text=new.text)


def _customer_contracts(session: Session, customer: str) -> set[str]:
    return set(contract_ids_of(session, customer))


def _of_tenant(row: ApiToken, customer: str, mine: set[str]) -> bool:
    """A token is a customer's when it reads that customer's data, or posts records only
    for that customer's contracts (and reads nobody else's)."""
    if row.customer is not None:
        return row.customer == customer
    return bool(row.contract_ids) and set(row.contract_ids) <= mine


def tenant_tokens(session: Session, customer: str) -> list[ApiToken]:
    """The API tokens of ``customer`` (:func:`_of_tenant`), live ones first, newest first
    within each; read as the application role (tokens are no tenant's table)."""
    mine = _customer_contracts(session, customer)
    rows = session.execute(select(ApiToken).order_by(ApiToken.id.desc())).scalars()
    out = [r for r in rows if _of_tenant(r, customer, mine)]
    return sorted(out, key=lambda r: r.revoked_at is not None)


def create_tenant_token(
    session: Session, principal: Principal, *, name: str, kind: str,
    contract_ids: list[str] | None = None,
) -> CreatedToken:
    """A customer admin's new token for their own customer: ``kind`` ``read`` (reads the
    customer's data through the API, as the portal shows it) or ``records`` (posts
    records for the named contracts, each of which must be the customer's).  Raises
    :class:`Invalid` naming the field, :class:`~web.errors.Forbidden` for anyone but a
    customer admin."""
    if principal.kind != "user" or not principal.customer_admin or principal.customer is None:
        raise Forbidden("Only your organisation's admin manages its API tokens.")
    name = name.strip()
    if not name or len(name) > 100 or not name.isprintable():
        raise Invalid("name: 1 to 100 printable characters")
    if kind == "read":
        return create_token(session, name=name, customer=principal.customer)
    if kind != "records":
        raise Invalid(f"kind: 'read' or 'records', got {kind!r}")
    ids = sorted(set(contract_ids or []))
    if not ids:
        raise Invalid("contracts: choose at least one contract the token posts records for")
    foreign = [c for c in ids if c not in _customer_contracts(session, principal.customer)]
    if foreign:
        raise Invalid(f"contracts: not yours: {', '.join(foreign)}")
    return create_token(session, name=name, contract_ids=ids)


def revoke_tenant_token(session: Session, principal: Principal, prefix: str) -> bytes | None:
    """Revoke the customer admin's own customer's live token ``prefix`` and return its
    stored hash (what a cache of live tokens is keyed by); None when the customer has no
    such live token (another customer's is never touched)."""
    if principal.kind != "user" or not principal.customer_admin or principal.customer is None:
        raise Forbidden("Only your organisation's admin manages its API tokens.")
    row = session.execute(
        select(ApiToken).where(ApiToken.prefix == prefix, ApiToken.revoked_at.is_(None))
    ).scalar_one_or_none()
    if row is None or not _of_tenant(row, principal.customer,
                                     _customer_contracts(session, principal.customer)):
        return None
    row.revoked_at = datetime.now(UTC)
    return bytes(row.secret_hash)


def token_principal(session: Session, text: str) -> Principal | None:
    """The principal of a live bearer token, or None (unknown, altered or revoked)."""
    prefix = token_prefix(text)
    if prefix is None:
        return None
    row = session.execute(
        select(ApiToken).where(ApiToken.prefix == prefix, ApiToken.revoked_at.is_(None))
    ).scalar_one_or_none()
    if row is None or not same_hash(bytes(row.secret_hash), sha256(text)):
        return None
    return Principal(
        kind="token",
        id=row.id,
        name=row.name,
        role="customer" if row.customer else "runtime",
        customer=row.customer,
        contract_ids=frozenset(row.contract_ids),
        scopes=frozenset(row.scopes or ()),
    )


def revoke_token(session: Session, prefix: str) -> bool:
    """Revoke the token with this prefix; False if there is none live."""
    row = session.execute(
        select(ApiToken).where(ApiToken.prefix == prefix, ApiToken.revoked_at.is_(None))
    ).scalar_one_or_none()
    if row is None:
        return False
    row.revoked_at = datetime.now(UTC)
    return True
