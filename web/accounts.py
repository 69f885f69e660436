"""Users, login sessions, API tokens and login rate limits (the application role's tables).

Services take a session and never commit; the caller's unit of work does.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from argon2 import PasswordHasher
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ledger.models import Contract
from web.errors import Invalid, RateLimited
from web.models import ROLES, ApiToken, LoginAttempt, PortalSession, PortalUser
from web.security import hash_password, new_api_token, same_hash, sha256, token_prefix
from web.security import verify_password as _verify

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+")
MIN_PASSWORD = 10


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
    )


def add_user(
    session: Session,
    hasher: PasswordHasher,
    *,
    email: str,
    name: str,
    role: str,
    password: str,
    customer: str | None = None,
) -> PortalUser:
    """Create a user (refusing a bad e-mail, role, short password or a taken e-mail)."""
    email = email.strip().lower()
    if not _EMAIL.fullmatch(email):
        raise Invalid(f"{email!r} is not an e-mail address")
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}")
    if role == "customer" and not (customer and customer.strip()):
        raise Invalid("a customer user needs --customer")
    if role != "customer" and customer:
        raise Invalid(f"an {role} user belongs to no customer (drop --customer)")
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
    )
    session.add(user)
    session.flush()
    return user


def customer_exists(session: Session, customer: str) -> bool:
    """True when some contract belongs to ``customer`` (read as the application role)."""
    return (
        session.execute(select(Contract.contract_id).where(Contract.customer == customer).limit(1))
        .first()
        is not None
    )


def authenticate(
    session: Session,
    hasher: PasswordHasher,
    *,
    email: str,
    password: str,
    address: str,
    per_account: int,
    per_address: int,
    window: timedelta,
    now: datetime | None = None,
) -> PortalUser | None:
    """The user whose e-mail and password match, or None (the failure is recorded).

    Raises :class:`RateLimited` before checking anything when the account or the
    client address has had too many failures in ``window``.  An unknown e-mail costs
    the same argon2 work as a wrong password, so timing does not tell them apart.
    """
    now = now or datetime.now(UTC)
    email = email.strip().lower()[:320]
    keys = (f"email:{email}", f"addr:{address}")
    since = now - window
    counts = dict(
        session.execute(
            select(LoginAttempt.key, func.count())
            .where(LoginAttempt.key.in_(keys), LoginAttempt.at >= since)
            .group_by(LoginAttempt.key)
        ).all()
    )
    if counts.get(keys[0], 0) >= per_account or counts.get(keys[1], 0) >= per_address:
        oldest = session.execute(
            select(func.min(LoginAttempt.at)).where(
                LoginAttempt.key.in_(keys), LoginAttempt.at >= since
            )
        ).scalar_one()
        retry = int(((oldest or now) + window - now).total_seconds()) + 1
        raise RateLimited(retry)
    user = session.execute(
        select(PortalUser).where(PortalUser.email == email)
    ).scalar_one_or_none()
    ok = _verify(hasher, user.password_hash if user else None, password)
    if not ok or user is None or user.disabled:
        session.add_all([LoginAttempt(key=k, at=now) for k in keys])
        session.flush()
        return None
    session.execute(delete(LoginAttempt).where(LoginAttempt.key == keys[0]))
    if hasher.check_needs_rehash(user.password_hash):
        user.password_hash = hash_password(hasher, password)
    return user


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
) -> CreatedToken:
    """Create a token that may post records for ``contract_ids`` and/or read ``customer``'s data.

    Every contract named must exist.
    """
    ids = sorted(set(contract_ids or []))
    if not ids and not customer:
        raise Invalid("a token needs --contract (to post records) or --customer (to read)")
    if ids:
        found = set(
            session.execute(
                select(Contract.contract_id).where(Contract.contract_id.in_(ids))
            ).scalars()
        )
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
    )
    session.add(row)
    session.flush()
    return CreatedToken(row=row, text=new.text)


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
