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

**E-mail recipients** (migration 0027): on the same page the admin adds an e-mail address
for the customer's alert kinds, lists them and removes one. Each is an e-mail
destination of that customer (``alerts.services.add_customer_email``) sent by the one
sender through the operator's relay (``YOCO_WEB_CUSTOMER_MAIL_VIA``: the operator's
e-mail destination whose SMTP server and From address it uses); a bad address is
refused naming the field, and nothing changes. A removed recipient is disabled for good.

**Audited**: every change an admin makes here to a webhook or a recipient (added, turned
off or on, removed) is a row of ``alert_destination_changes`` naming who and when,
written in the change's transaction; the page shows the latest 20.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

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


def _who(admin: Principal) -> str:
    """The admin as the audit trail names them."""
    return f"{admin.name} (user #{admin.id})"


def _alerts_page(request: Request, portal: Portal, admin: Principal, *,
                 created: object = None, added: str | None = None,
                 removed: str | None = None) -> Response:
    from alerts.services import (
        customer_changes,
        customer_recipients,
        destination_json,
        list_destinations,
    )

    customer = admin.customer or ""
    with portal.db.write() as db:
        mine = [destination_json(d) for d in list_destinations(db)
                if d.kind == "webhook" and d.customer is not None and d.customer == customer]
        recipients = [{"name": d.name, "address": d.mail_to[0],
                       "events": list(d.event_kinds), "created_at": d.created_at}
                      for d in customer_recipients(db, customer)]
        changes = [{"at": c.changed_at, "action": c.action, "by": c.changed_by,
                    "what": d.mail_to[0] if d.kind == "email" and d.mail_to else d.url,
                    "kind": d.kind}
                   for c, d in customer_changes(db, customer)]
    # A confirmation only of what happened (a link cannot make the page claim more).
    if added not in {r["address"] for r in recipients}:
        added = None
    if removed not in {c["what"] for c in changes if c["action"] == "removed"}:
        removed = None
    response = page(
        request, "account_alerts.html",
        {"destinations": mine, "kinds": CUSTOMER_KINDS, "created": created,
         "recipients": recipients, "changes": changes, "added": added, "removed": removed,
         "mail_offered": portal.settings.customer_mail_via is not None,
         "section": "account-alerts"},
    )
    response.headers["Cache-Control"] = "no-store"  # may show a signing secret
    return response


def _kinds(events: list[str] | None) -> list[str]:
    """The customer's alert kinds chosen in a form (none chosen: all of them); Invalid
    naming the field for any other kind."""
    kinds = sorted(set(events or []))
    foreign = [k for k in kinds if k not in CUSTOMER_KINDS]
    if foreign:
        raise Invalid(f"event: not a customer's alert: {', '.join(foreign)}")
    return kinds or list(CUSTOMER_KINDS)


@router.get("/account/alerts")
def alerts_page(request: Request, admin: AdminDep, portal: PortalDep) -> Response:
    """The customer's alert webhooks (never their secrets) and e-mail recipients, the
    forms to add one, and the latest changes made to them."""
    q = request.query_params
    return _alerts_page(request, portal, admin, added=q.get("added"), removed=q.get("removed"))


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
    from alerts.services import add_webhook, record_change

    kinds = _kinds(events)
    try:
        with portal.db.write() as db:
            dest, secret = add_webhook(
                db, name=f"cust-{secrets.token_hex(6)}", url=url.strip(),
                customer=admin.customer, events=kinds, customer_managed=True,
            )
            record_change(db, dest, "added", _who(admin))
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
    from alerts.services import record_change

    if action not in ("disable", "enable"):
        raise NotFound()
    with portal.db.write() as db:
        dest = db.execute(
            select(AlertDestination).where(AlertDestination.name == name)
        ).scalar_one_or_none()
        if dest is None or dest.customer is None or dest.customer != admin.customer \
                or dest.kind != "webhook":
            raise NotFound()
        dest.enabled = action == "enable"
        record_change(db, dest, f"{action}d", _who(admin))
    return RedirectResponse("/account/alerts", status_code=303)


@router.post("/account/alerts/emails")
def add_alert_email(
    request: Request,
    admin: AdminDep,
    portal: PortalDep,
    _csrf: CsrfDep,
    email: Annotated[str, Form(max_length=400)] = "",
    events: Annotated[list[str] | None, Form(alias="event")] = None,
) -> Response:
    """Add an e-mail recipient of the admin's customer's alerts of the chosen kinds
    (none: every kind of theirs), sent through the operator's relay; a bad address is
    refused naming the field and nothing is written."""
    from alerts.errors import BadDestination
    from alerts.services import add_customer_email

    kinds = _kinds(events)
    try:
        with portal.db.write() as db:
            dest = add_customer_email(db, customer=admin.customer or "", address=email,
                                      events=kinds, relay=portal.settings.customer_mail_via,
                                      changed_by=_who(admin))
            address = dest.mail_to[0]
    except BadDestination as exc:
        raise Invalid(str(exc)) from None
    return RedirectResponse(f"/account/alerts?added={quote(address)}#emails-h",
                            status_code=303)


@router.post("/account/alerts/emails/{name}/remove")
def remove_alert_email(
    name: str, admin: AdminDep, portal: PortalDep, _csrf: CsrfDep
) -> Response:
    """Remove one of the admin's customer's e-mail recipients (it gets no alert from
    now on); 404 for any other destination."""
    from alerts.services import remove_customer_email

    with portal.db.write() as db:
        dest = remove_customer_email(db, customer=admin.customer or "", name=name,
                                     changed_by=_who(admin))
        if dest is None:
            raise NotFound()
        address = dest.mail_to[0]
    return RedirectResponse(f"/account/alerts?removed={quote(address)}#emails-h",
                            status_code=303)
