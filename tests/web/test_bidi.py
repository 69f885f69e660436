"""Stored strings shown in pages are bidi isolates: a U+202E (or any
bidi control, or right-to-left text) in an id, a node, a detail or a dispute's reason
cannot reorder the page around it. Real PostgreSQL, the real app."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from jinja2 import Environment

from tests import factories as fx
from web import filters

RLO, FSI, PDI, LRI = "\u202e", "\u2068", "\u2069", "\u2066"
CID = f"C-{RLO}lave"


def _every_control_is_isolated(html: str) -> int:
    """How many bidi overrides the page shows; fails if one is outside an isolate."""
    depth = 0
    seen = 0
    for ch in html:
        if ch == FSI:
            depth += 1
        elif ch == PDI and depth:
            depth -= 1
        elif ch == RLO:
            seen += 1
            assert depth > 0, "a bidi override outside any isolate"
    assert depth == 0, "an isolate left open"
    return seen


def _seed(seeded: Any) -> str:
    from billing.disputes import open_dispute
    from ledger.contracts import add_contracts
    from ledger.ingest import ingest
    from ledger.records import parse_contracts, validate_batch
    from yoco.database import unit_of_work

    ctx, _ = seeded
    specs, errors = parse_contracts(json.dumps([fx.contract(CID, customer="Acme AI")]).encode())
    assert not errors
    fail = fx.rec("failure", CID, fx.T0 + timedelta(days=1), job_id=f"j{RLO}1",
                  failure_class="unplanned", cause="gpu_lost", node=f"node-{RLO}7",
                  detail=f"ECC {RLO}gnirts`code{RLO}`")
    with unit_of_work(ctx.engine) as s:
        add_contracts(s, specs)
        recs, errs = validate_batch([fx.rec("job_started", CID, fx.T0, job_id=f"j{RLO}1",
                                            gpus=8), fail])
        assert not errs, errs
        ingest(s, recs, None, ctx.projectors)
        open_dispute(s, CID, fail["event_id"], reason=f"we {RLO}tsol more", opened_by="a")
    return str(fail["event_id"])


def test_every_stored_string_with_a_bidi_override_is_isolated_in_pages(
        seeded, client_for) -> None:
    fid = _seed(seeded)
    alice, olga = client_for("a"), client_for("op")
    path = f"/contracts/{quote(CID, safe='')}"
    pages = {
        "contracts": alice.get("/contracts"),
        "dashboard": alice.get(path),
        "failures": alice.get(f"{path}/failures"),
        "failure": alice.get(f"{path}/failures/{fid}"),
        "disputes": olga.get("/operator/disputes"),
    }
    for name, r in pages.items():
        assert r.status_code == 200, (name, r.status_code)
        assert _every_control_is_isolated(r.text) > 0, name
    failure = pages["failure"].text
    assert f"{FSI}node-{RLO}7{PDI}" in failure
    assert f"{FSI}we {RLO}tsol more{PDI}" in pages["disputes"].text


def test_the_isolation_is_one_finalize_for_every_expression() -> None:
    """Plain strings are isolated only when they hold right-to-left text or a control;
    a stray PDI cannot close the wrapper early; isolates left open are closed; URLs
    built with `urlencode` and markup from filters are untouched."""
    env = Environment(autoescape=True)
    filters.install(env)
    t = env.from_string('<a href="/c/{{ x | urlencode }}" title="{{ x }}">{{ x }}</a>{{ n }}')
    html = t.render(x=f"a{RLO}b", n=42)
    assert html == (f'<a href="/c/a%E2%80%AEb" title="{FSI}a{RLO}b{PDI}">'
                    f"{FSI}a{RLO}b{PDI}</a>42")
    assert filters.isolate("plain ascii") == "plain ascii"
    assert filters.isolate("שלום") == f"{FSI}שלום{PDI}"
    assert filters.isolate(f"a{PDI}{RLO}b") == f"{FSI}a\ufffd{RLO}b{PDI}"
    assert filters.isolate(f"{LRI}x") == f"{FSI}{LRI}x{PDI}{PDI}"
