"""A customer's own admin manages their organisation's API tokens (``/account/tokens``)
and alert webhooks (``/account/alerts``).

Before, only an operator could create or revoke a token, from the command line. A
customer user marked ``customer_admin`` (``yoco users add --customer-admin``) lists the
tokens of their own customer, creates one (a read token for the API, or a token that
posts records for chosen contracts of theirs: never another customer's) and revokes one.
The new token's text is shown once, on the answer to the POST (never stored, never in a
URL). Every change is a CSRF-checked form. Everyone else gets 404 (the page is not
advertised to them). Tokens are no tenant's table: they are read and written through the
application role once the caller is known to be the customer's admin.

**Alert webhooks**: the admin adds a webhook for their customer (alerts' ``add_webhook``
with the customer set, so it only ever gets that customer's events, and
``customer_managed``: only public addresses, checked when added and again at each send —
loopback and private networks, which the operator's own receivers may use, are refused),
chooses which of the customer's alert kinds it gets, sees its signing secret once, and
turns it off or on. Its name is made here (``cust-`` and random hex): names are unique
across tenants, and a name a customer chose could tell them another's exists.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse, Response

from ledger.contracts import contract_ids_of
from web.accounts import Principal, create_tenant_token, revoke_tenant_token, tenant_tokens
from web.deps import CsrfDep, PortalDep, UserDep
from web.errors import Invalid, NotFound
from web.portal import Portal
from web.render import page

router = APIRouter(include_in_schema=False)


def customer_admin(user: UserDep) -> Principal:
    """A customer's admin; everyone else gets 404."""
    if user.kind != "user" or not user.customer_admin or user.customer is None:
        raise NotFound()
    return user


AdminDep = Annotated[Principal, Depends(customer_admin)]


def _page(request: Request, portal: Portal, admin: Principal, *, created: object = None,
          revoked: str | None = None, status_code: int = 200) -> Response:

    customer = admin.customer or ""
    with portal.db.write() as db:
        tokens = [
            {"prefix": t.prefix, "name": t.name, "customer": t.customer,
             "contract_ids": list(t.contract_ids), "created_at": t.created_at,
             "revoked_at": t.revoked_at}
            for t in tenant_tokens(db, customer)
        ]
        contracts = contract_ids_of(db, customer)
    response = page(
        request, "tokens.html",
        {"tokens": tokens, "contracts": contracts, "created": created, "revoked": revoked,
         "section": "tokens"},
        status_code=status_code,
    )
    # the page may show a new token's text: no cache keeps it
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get("/account/tokens")
def tokens_page(request: Request, admin: AdminDep, portal: PortalDep) -> Response:
    """The customer's API tokens (live first), the form to create one and a revoke button
    for each live one."""
    return _page(request, portal, admin, revoked=request.query_params.get("revoked"))


@router.post("/account/tokens")
def create_token(
    request: Request,
    admin: AdminDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    name: Annotated[str, Form(max_length=200)] = "",
    kind: Annotated[str, Form(max_length=20)] = "",
    contract_ids: Annotated[list[str] | None, Form(alias="contract")] = None,
) -> Response:
    """Create a token of the admin's customer and show its text once."""
    with portal.db.write() as db:
        made = create_tenant_token(db, admin, name=name, kind=kind,
                                   contract_ids=contract_ids or [])
        created = {"text": made.text, "name": made.row.name, "prefix": made.row.prefix,
                   "kind": kind}
    return _page(request, portal, admin, created=created)


@router.post("/account/tokens/{prefix}/revoke")
def revoke_token(prefix: str, admin: AdminDep, portal: PortalDep, _csrf: CsrfDep) -> Response:
    """Revoke a live token of the admin's customer (404 for any other)."""
    with portal.db.write() as db:
        secret_hash = revoke_tenant_token(db, admin, prefix)
        if secret_hash is None:
            raise NotFound()
    # refused at once by this process (others stop reading with it within their cache's
    # TTL, as for a token revoked from the command line)
    portal.cache.tokens.drop(secret_hash.hex())
    return RedirectResponse(f"/account/tokens?revoked={prefix}", status_code=303)


#: The alert kinds that concern a customer (the others are the operator's).
CUSTOMER_KINDS = ("year_at_risk", "year_below", "year_missed", "credit_issued",
                  "checkpoint_cosigned")


def _alerts_page(request: Request, portal: Portal, admin: Principal, *,
                 created: object = None) -> Response:
    from alerts.services import destination_json, list_destinations

    with portal.db.write() as db:
        mine = [destination_json(d) for d in list_destinations(db)
                if d.customer is not None and d.customer == admin.customer]
    response = page(
        request, "account_alerts.html",
        {"destinations": mine, "kinds": CUSTOMER_KINDS, "created": created,
         "section": "account-alerts"},
    )
    response.headers["Cache-Control"] = "no-store"  # may show a signing secret
    return response


@router.get("/account/alerts")
def alerts_page(request: Request, admin: AdminDep, portal: PortalDep) -> Response:
    """The customer's alert webhooks (never their secrets) and the form to add one."""
    return _alerts_page(request, portal, admin)


@router.post("/account/alerts")
def add_alert_webhook(
    request: Request,
    admin: AdminDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    url: Annotated[str, Form(max_length=2000)] = "",
    events: Annotated[list[str] | None, Form(alias="event")] = None,
) -> Response:
    """Add a webhook of the admin's customer for the chosen kinds (none: every kind of
    theirs); its signing secret is shown once."""
    import secrets

    from alerts.errors import BadDestination
    from alerts.services import add_webhook

    kinds = sorted(set(events or []))
    foreign = [k for k in kinds if k not in CUSTOMER_KINDS]
    if foreign:
        raise Invalid(f"event: not a customer's alert: {', '.join(foreign)}")
    try:
        with portal.db.write() as db:
            dest, secret = add_webhook(
                db, name=f"cust-{secrets.token_hex(6)}", url=url.strip(),
                customer=admin.customer, events=kinds or list(CUSTOMER_KINDS),
                customer_managed=True,
            )
            created = {"name": dest.name, "url": dest.url, "secret": secret}
    except BadDestination as exc:
        raise Invalid(str(exc)) from None
    return _alerts_page(request, portal, admin, created=created)


@router.post("/account/alerts/{name}/{action}")
def switch_alert_webhook(
    name: str, action: str, admin: AdminDep, portal: PortalDep, _csrf: CsrfDep
) -> Response:
    """Turn one of the admin's customer's webhooks off (``disable``) or on (``enable``);
    404 for any other destination."""
    from sqlalchemy import select

    from alerts.models import AlertDestination

    if action not in ("disable", "enable"):
        raise NotFound()
    with portal.db.write() as db:
        dest = db.execute(
            select(AlertDestination).where(AlertDestination.name == name)
        ).scalar_one_or_none()
        if dest is None or dest.customer is None or dest.customer != admin.customer:
            raise NotFound()
        dest.enabled = action == "enable"
    return RedirectResponse("/account/alerts", status_code=303)
