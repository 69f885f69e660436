"""The one neutraliser of stored text printed on a terminal (yoco_records.textsafe), and
its use by the CLI's shared printers; the one bidi isolation rule of pages, documents and
spreadsheets (``isolate``)."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table

from yoco.cli import shown
from yoco.render import print_table
from yoco_records.textsafe import isolate, isolate_stored, safe_lines, safe_text

ATTACK = "late\x1b[2J\x1b[HOK: every check passed\u202edessap\x9b31m\nFAILED"


def test_controls_and_bidi_become_visible_escapes() -> None:
    s = safe_text(ATTACK)
    assert s == ("late\\u001b[2J\\u001b[HOK: every check passed\\u202edessap\\u009b31m"
                 "\\u000aFAILED")
    assert s.isprintable()
    for ch in ("\t", "\r", "\x7f", "\u2066", "\u2069", "\u200f", "\u061c", "\u2028"):
        assert safe_text(f"a{ch}b") == f"a\\u{ord(ch):04x}b"
    # Plain text, accents, CJK and emoji print unchanged.
    plain = "Müller GmbH — 東京 ✓ 🚀 [bold] 50 %"
    assert safe_text(plain) == plain
    assert safe_text(12) == "12"


def test_safe_lines_keeps_json_valid_with_the_same_values() -> None:
    obj = {"reason": ATTACK, "who": "Zoë"}
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    assert "\u202e" in text  # json.dumps leaves bidi and C1 characters raw
    safe = safe_lines(text)
    assert "\u202e" not in safe and "\x9b" not in safe and "\x1b" not in safe
    assert json.loads(safe) == obj
    assert safe.count("\n") == text.count("\n")


def test_cli_lines_and_tables_print_no_control_character() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    console.print(f"reason: {shown(ATTACK + ' [/]')}", highlight=False)
    table = Table("id", "reason", title=ATTACK)
    table.add_row("d-1", ATTACK)
    print_table(console, table)
    printed = buf.getvalue()
    assert "\x1b" not in printed and "\u202e" not in printed and "\x9b" not in printed
    assert "\\u001b[2J" in printed and "\\u202e" in printed
    assert "[/]" in printed  # stored markup is shown, not interpreted


FSI, PDI, RLO, LRI, LRM, RLM, ZWSP = "\u2068", "\u2069", "\u202e", "\u2066", "\u200e", "\u200f", "\u200b"


def test_isolate_wraps_only_what_can_reorder_its_surroundings() -> None:
    """Right-to-left letters, the invisible bidi marks and the bidi controls make an
    isolate; plain text, zero-width spaces and joiners are left exactly as they are."""
    for plain in ("plain ascii", "Müller — 東京 🚀", f"Ac{ZWSP}me", "x\u200cy\u200dz\u2060\ufeff"):
        assert isolate(plain) == plain
    assert isolate("שלום") == f"{FSI}שלום{PDI}"
    assert isolate(f"Acme{RLM}") == f"{FSI}Acme{RLM}{PDI}"
    assert isolate(f"Acme{LRM}") == f"{FSI}Acme{LRM}{PDI}"
    assert isolate(f"a{PDI}{RLO}b") == f"{FSI}a\ufffd{RLO}b{PDI}"  # no early close
    assert isolate(f"{LRI}x") == f"{FSI}{LRI}x{PDI}{PDI}"  # an open isolate is closed


def test_isolate_works_paragraph_by_paragraph() -> None:
    """A paragraph separator ends every isolate opened before it: one wrapper around the
    whole would let an override after it reach the text that follows the string, so
    each paragraph is its own isolate and the separators are kept."""
    for sep in ("\n", "\r", "\u2029", "\x1c", "\x85"):
        assert isolate(f"a{sep}{RLO}evil") == f"a{sep}{FSI}{RLO}evil{PDI}"
    assert isolate(f"{RLO}x\n{RLO}y") == f"{FSI}{RLO}x{PDI}\n{FSI}{RLO}y{PDI}"


def test_isolate_stored_isolates_plain_strings_only() -> None:
    from markupsafe import Markup

    assert isolate_stored(f"a{RLO}b") == f"{FSI}a{RLO}b{PDI}"
    markup = Markup(f"<b>{RLO}</b>")
    assert isolate_stored(markup) is markup
    assert isolate_stored(42) == 42 and isolate_stored(None) is None
