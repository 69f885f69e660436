"""The one neutraliser of stored text printed on a terminal (yoco_records.textsafe), and
its use by the CLI's shared printers."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table

from yoco.cli import shown
from yoco.render import print_table
from yoco_records.textsafe import safe_lines, safe_text

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
