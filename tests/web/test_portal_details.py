"""The portal's details, as its users read them (TestClient; the browser test looks too)."""

from __future__ import annotations

import re
from datetime import timedelta

from tests.web.conftest import csrf_of


def test_unresolved_card_lists_every_unresolved_failure(client_for) -> None:
    alice = client_for("a")
    html = alice.get("/contracts/C-A").text
    card = html.split('<span class="label">Unresolved</span>', 1)[0].rsplit("<a ", 1)[1]
    assert "status=unresolved" in card
    # Seed C-A: one rolled back, one pending (the failed one is excluded by cause).
    listed = alice.get("/contracts/C-A/failures", params={"status": "unresolved"}).text
    assert "2 failures match" in listed
    assert "rolled back" in listed and "pending" in listed


def test_failure_page_reads_as_words(client_for, seed) -> None:
    alice = client_for("a")
    resolved = alice.get(f"/contracts/C-A/failures/{seed.failures['C-A'][0]}").text
    title = re.search(r"<title>([^<]+)</title>", resolved).group(1)
    assert seed.failures["C-A"][0] not in title and "Unplanned failure: GPU lost" in title
    # 8 GPUs × 2.5 s of recovery: 20 GPU-seconds = 0.0056 GPU-hours, not "0.01", and why.
    assert 'data-test="lost-gpu-hours">0.0056<' in resolved
    assert "8 GPUs × (2.5 s recovery)" in resolved
    # Labelled fields, formatted values; no raw field names.
    assert "<dt>Recovery time</dt><dd>2.5 s</dd>" in resolved
    assert "recovery seconds" not in resolved and "<dt>job</dt>" not in resolved
    # The proof link opens like any link: a 409 page is not cancelled as a download.
    assert not re.search(r"/proof\"[^>]*\bdownload\b", resolved)
    rolled = alice.get(f"/contracts/C-A/failures/{seed.failures['C-A'][1]}").text
    assert 'class="t-outcome tone-warn"' in rolled  # a rolled-back outcome is not green
    assert 'class="t-outcome tone-ok"' in resolved


def test_proof_of_an_entry_no_checkpoint_covers_explains_itself(client_for, seed) -> None:
    alice = client_for("a")
    page = alice.get(f"/contracts/C-A/failures/{seed.failures['C-A'][1]}")
    r = alice.post(f"/contracts/C-A/failures/{seed.failures['C-A'][0]}/disputes",
                   data={"csrf_token": csrf_of(page.text), "reason": "check"},
                   follow_redirects=False)
    assert r.status_code == 303 and "disputed=1" in r.headers["location"]
    html = alice.get(r.headers["location"]).text
    dispute_id = re.findall(r'/entries/([0-9a-f-]{36})/proof" data-test="proof-dispute"', html)
    assert dispute_id, "the new dispute's entry has a proof link"
    proof = alice.get(f"/contracts/C-A/entries/{dispute_id[-1]}/proof")
    assert proof.status_code == 409 and "signed checkpoint" in proof.text
    # It states the deployment's checkpoint interval (YOCO_LEDGER_CHECKPOINT_EVERY_S).
    assert "within 5 minutes of the entry" in proof.text


def test_disputes_queue_has_no_default_decision_and_shows_the_outcome(client_for) -> None:
    olga = client_for("op")
    html = olga.get("/operator/disputes").text
    assert 'type="radio"' in html and "checked" not in html
    assert 'class="primary"' not in html.split("<h1", 1)[1]
    assert 'data-test="dispute-failure"' in html and "rolled back" in html
    assert "120 lost steps" in html
    # Without a chosen decision the desk gets a clear refusal, nothing recorded.
    did = re.search(r'action="/operator/disputes/([0-9a-f-]+)"', html).group(1)
    r = olga.post(f"/operator/disputes/{did}", data={"csrf_token": csrf_of(html), "note": "x"})
    assert r.status_code in (400, 422) and "Choose" in r.text


def test_pages_have_landmarks_a_skip_link_and_no_empty_headers(client_for) -> None:
    alice = client_for("a")
    for path in ("/contracts/C-A", "/contracts/C-A/failures", "/contracts/C-A/credits"):
        html = alice.get(path).text
        assert '<a class="skip-link" href="#main">' in html and '<main id="main"' in html
        assert 'class="contract-bar" role="region" aria-label="Contract C-A"' in html
        assert "<th></th>" not in html
    docs = alice.get("/api/docs").text
    assert "`" not in docs.split("<main", 1)[1] and "<code>" in docs


def test_money_and_times_in_the_contracts_zone(client_for) -> None:
    olga = client_for("op")
    html = olga.get("/contracts/C-A2").text  # America/New_York
    assert "dates and times in America/New_York" in html
    assert "2026-01-01 to 2027-01-01" in html


def test_chart_labels_agree_with_their_colour() -> None:
    from datetime import UTC, datetime
    from decimal import Decimal
    from types import SimpleNamespace

    from web.filters import monthly_chart
    from web.views import MonthFigures

    def month(label: str, resolved: int, covered: int, threshold: int) -> MonthFigures:
        figs = SimpleNamespace(resolved_failures=resolved, covered_failures=covered,
                               guarantee_met=resolved * 100 >= covered * threshold)
        t = datetime(2026, 1, 1, tzinfo=UTC)
        return MonthFigures(label, t, t, figs)  # type: ignore[arg-type]

    svg = str(monthly_chart([month("2026-01", 948, 1000, 95),
                             month("2026-02", 22499, 25000, 95),
                             month("2026-03", 95, 100, 95)], Decimal(95)))
    bars = re.findall(r'class="bar (ok|miss)">.*?</rect><text[^>]*class="val"[^>]*>([^<]+)<', svg)
    assert bars == [("miss", "94.80"), ("miss", "90.00"), ("ok", "95.00")]
    # The threshold's label sits on the axis, away from the last month's label.
    assert 'class="threshold-label" text-anchor="end">95%<' in svg
    svg = str(monthly_chart([month("2026-01", 22499, 25000, 90)], Decimal(90)))
    assert 'class="bar miss"' in svg and ">89.99<" in svg  # never "90.00" on a red bar
    # The threshold line is drawn before the bars and their labels (never over a label).
    assert svg.index('class="threshold"') < svg.index('class="bar ')
    # Every year is drawn on the same 0-100 % scale, whatever its rates.
    high = str(monthly_chart([month("2026-01", 99, 100, 90)], Decimal(90)))
    low = str(monthly_chart([month("2026-01", 40, 100, 90)], Decimal(90)))
    ticks = re.compile(r'class="tick y[^"]*" text-anchor="end">(\d+)%<')
    assert ticks.findall(high) == ticks.findall(low) == ["25", "50", "75", "100"]


def test_a_pending_failure_shows_its_wait_and_no_made_up_loss(app, client_for, seed) -> None:
    from billing.verdict import format_elapsed
    from tests import factories as fx

    alice = client_for("a")
    now = app.state.portal.now()
    pending_at = fx.T0 + timedelta(days=101)  # the seed's pending kernel_panic
    wait = format_elapsed(int((now - pending_at).total_seconds()))
    html = alice.get(f"/contracts/C-A/failures/{seed.failures['C-A'][5]}").text
    assert 'data-test="lost-gpu-hours">unknown<' in html  # not "0.00": it is not known
    assert f"No outcome recorded in the {wait} since the failure" in html
    listed = alice.get("/contracts/C-A/failures", params={"status": "pending"}).text
    assert f'data-test="waiting">no outcome for {wait}<' in listed
    assert ">unknown</span></td>" in listed
    # a failure with an outcome still shows its lost GPU-hours
    resolved = alice.get(f"/contracts/C-A/failures/{seed.failures['C-A'][0]}").text
    assert 'data-test="lost-gpu-hours">0.0056<' in resolved


def test_format_elapsed_rounds_down_to_the_largest_unit() -> None:
    import pytest

    from billing.verdict import format_elapsed

    assert format_elapsed(59) == "under a minute"
    assert format_elapsed(60) == "1 min"
    assert format_elapsed(3 * 3600 + 59 * 60) == "3 h"
    assert format_elapsed(86400) == "1 day"
    assert format_elapsed(8 * 30 * 86400 + 5) == "8 months"
    assert format_elapsed(2 * 365 * 86400) == "2 years"
    with pytest.raises(ValueError, match="negative"):
        format_elapsed(-1)


def test_the_footer_leads_to_a_guide_with_the_key_and_every_download(app, client_for) -> None:
    alice = client_for("a")
    html = alice.get("/contracts/C-A").text
    assert '<a href="/verify">how to check the figures yourself</a>' in html
    guide = alice.get("/verify")
    assert guide.status_code == 200
    text = guide.text
    assert app.state.portal.verifier_key in text
    assert 'href="/public-key" download="operator.key"' in text
    for link in ("/contracts/C-A/checkpoints", "/contracts/C-A/reports",
                 "/contracts/C-A/failures"):
        assert f'href="{link}"' in text
    assert "C-B" not in text  # another customer's contract is not listed
    assert "yoco-verify" in text and "yoco verify-proof" in text
    # a page of the portal, with its way back (the header) and a title
    assert "<title>Check the figures yourself" in text and 'lang="en"' in text
    assert client_for().get("/verify", follow_redirects=False).status_code in (303, 401)
