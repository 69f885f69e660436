"""One home for the words of a failure's class, cause and outcome, and of a year's end.

billing.labels defines how a class, cause and outcome read; billing.yearend how a
contract year's span, state and closing verdict read.  The portal, the reports, the
alerts and the command line import them: no module of theirs turns a code into words on
its own (``replace("_", " ")``, its own "pre-emptive"), and no portal template prints a
failure's class or cause without the label filters.  What each surface then shows is
compared in tests/web/test_one_wording.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from billing.labels import cause_label, causes_text, class_label, classes_text, outcome_label
from billing.yearend import closed_verdict_text, period_text, year_days, year_state

ROOT = Path(__file__).resolve().parents[1]
SURFACES = ("web", "reports", "alerts", "yoco", "billing")
HOMES = {ROOT / "billing" / "labels.py", ROOT / "billing" / "yearend.py"}


def _sources() -> list[Path]:
    return [p for pkg in SURFACES for p in sorted((ROOT / pkg).rglob("*.py")) if p not in HOMES]


def test_no_surface_turns_a_code_into_words_by_itself() -> None:
    own = re.compile(r"""\.replace\(\s*["']_["']\s*,\s*["'] ["']\s*\)""")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _sources()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if own.search(line)]
    assert not found, f"code → words outside billing.labels: {found}"


@pytest.mark.parametrize("word", ['"pre-emptive"', '"live-migrated"', '"to come"',
                                  '"ended, closing"'])
def test_the_words_are_defined_once(word: str) -> None:
    found = [str(p.relative_to(ROOT)) for p in _sources()
             if word in p.read_text(encoding="utf-8")]
    assert not found, f"{word} defined outside billing.labels / billing.yearend: {found}"


def test_portal_templates_print_class_and_cause_through_the_labels() -> None:
    # (a class attribute such as ``badge s-{{ f.outcome }}`` names a style, not words)
    bare = re.compile(r"(?<!s-)\{\{[^}]*\.(failure_class|cause|outcome)\s*"
                      r"(\}\}|\|\s*(label|capitalize)\b)")
    found = [f"{p.name}:{n}: {m.group(0)}"
             for p in sorted((ROOT / "web" / "templates").glob("*.html"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in bare.finditer(line)]
    assert not found, f"a class, cause or outcome printed as its code: {found}"


def test_labels() -> None:
    assert class_label("preemptive") == "pre-emptive" and class_label("unplanned") == "unplanned"
    assert cause_label("gpu_lost") == "GPU lost"
    assert cause_label("ecc_uncorrectable") == "ECC uncorrectable"
    assert cause_label("nvlink_down") == "NVLink down"
    assert cause_label("network_wide_outage") == "network wide outage"
    assert cause_label(None) == class_label("") == "—"
    assert outcome_label("live_migrated") == "live-migrated"
    assert outcome_label("rolled_back") == "rolled back"
    assert classes_text({"preemptive", "unplanned"}) == "unplanned, pre-emptive"
    assert classes_text(()) == causes_text([]) == "none"
    assert causes_text({"facility_power", "customer_code"}) == "customer code, facility power"


def test_year_words() -> None:
    from datetime import UTC, date, datetime

    first, last = year_days(date(2024, 2, 29), 1)
    assert period_text(first, last) == "2024-02-29 to 2025-02-27"
    assert period_text(*year_days(date(2026, 1, 1), 2)) == "2027-01-01 to 2027-12-31"
    s, e = datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    at = datetime(2026, 6, 1, tzinfo=UTC)
    assert year_state(s, e, datetime(2025, 6, 1, tzinfo=UTC), False) == "not_started"
    assert year_state(s, e, at, False) == "open"
    assert year_state(s, e, e, False) == "closing"
    assert year_state(s, e, at, True) == "closed"
    assert closed_verdict_text(True) == "guarantee met"
    assert closed_verdict_text(False) == "guarantee missed"
    with pytest.raises(ValueError, match="now"):
        year_state(s, e, datetime(2026, 6, 1), False)
