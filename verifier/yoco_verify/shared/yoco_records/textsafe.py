# A copy of yoco_records/textsafe.py, written by scripts/vendor_verifier.py: edit the original and
# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).
"""Stored text made safe to print on a terminal: the one neutraliser of every CLI output.

Text in the ledger comes from outside (an exclusion or dispute reason, a job id, an
alert's message): any ingest token can write it.  Printed raw, ``ESC[2J`` clears the
operator's screen and a forged line can be drawn over the real one; a right-to-left
override (U+202E) makes ``FAILED`` read backwards or hides what follows it.  Every CLI
that prints stored text (``yoco-verify``, ``yoco billing dispute list``, alerts, the
ledger's commands, exports to the terminal) passes it through :func:`safe_text` first.

It lives in ``yoco_records`` (the package both distributions hold: the verifier ships
a copy as ``yoco_verify.shared.yoco_records.textsafe``, proved equal by
``tests/audit/test_vendored.py``), so there is one home for the rule.
"""

from __future__ import annotations

import re

__all__ = ["safe_lines", "safe_text"]

#: C0 controls (newline and tab included: one field is one line), DEL, C1 controls
#: (0x9B is a one-byte CSI on some terminals), the bidirectional embeddings, overrides,
#: isolates and marks, and the line and paragraph separators.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group(0)):04x}"


def safe_text(value: object) -> str:
    """``str(value)`` with every control and bidirectional formatting character replaced
    by its visible escape ``\\uXXXX`` (``ESC`` → ``\\u001b``, U+202E → ``\\u202e``, a
    newline → ``\\u000a``).  Every other character, non-ASCII letters included, is kept
    as is, so plain text prints unchanged; the result never moves the cursor, changes
    colours or reorders what a terminal shows.  The escapes are JSON's: inside a JSON
    string they stand for the same character."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)


def safe_lines(text: str) -> str:
    """:func:`safe_text` of each line of ``text``, the line breaks kept: for output of
    several lines (indented JSON, whose own line breaks are structure, stays valid JSON
    with the same values)."""
    return "\n".join(safe_text(line) for line in text.split("\n"))
