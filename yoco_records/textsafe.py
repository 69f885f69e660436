"""Stored text made safe to print on a terminal: the one neutraliser of every CLI output.

Text in the ledger comes from outside (an exclusion or dispute reason, a job id, an
alert's message): any ingest token can write it.  Printed raw, ``ESC[2J`` clears the
operator's screen and a forged line can be drawn over the real one; a right-to-left
override (U+202E) makes ``FAILED`` read backwards or hides what follows it.  Every CLI
that prints stored text (``yoco-verify``, ``yoco billing dispute list``, alerts, the
ledger's commands, exports to the terminal) passes it through :func:`safe_text` first.

Documents and pages do not escape such text (the reader sees the name as written) but
isolate it: :func:`isolate` wraps a string holding right-to-left text or a bidi control
in FIRST STRONG ISOLATE … POP DIRECTIONAL ISOLATE (what ``<bdi>`` does), so nothing in it
reorders the text around it.  The portal's pages, the monthly reports and year-end
statements (HTML and, through Pango, PDF) and the finance export's CSV/XLSX cells all
use it; :func:`isolate_stored` is the Jinja ``finalize`` hook both template environments
install, so every ``{{ … }}`` that shows a plain string is isolated.

It lives in ``yoco_records`` (the package both distributions hold: the verifier ships
a copy as ``yoco_verify.shared.yoco_records.textsafe``, proved equal by
``tests/audit/test_vendored.py``), so there is one home for the rule.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["isolate", "isolate_stored", "safe_lines", "safe_text"]

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


#: Bidirectional classes that can reorder the text around a string: right-to-left
#: letters (the invisible RIGHT-TO-LEFT MARK U+200F and ARABIC LETTER MARK U+061C among
#: them) and every embedding, override and isolate control (U+202A–U+202E,
#: U+2066–U+2069).  Other invisible characters (ZERO WIDTH SPACE, JOINER and NON-JOINER,
#: WORD JOINER, the BOM) are boundary-neutral: they cannot move any other character, and
#: the joiners are part of the correct spelling of Persian and Indic names, so they are
#: kept as written.
_BIDI_CLASSES = frozenset(
    {"R", "AL", "RLE", "RLO", "LRE", "LRO", "PDF", "RLI", "LRI", "FSI", "PDI"}
)
#: LEFT-TO-RIGHT MARK: class L like any Latin letter, but invisible and used only to
#: steer the neutrals around it, so a string holding one is isolated too.
_LRM = "\u200e"
_FSI, _PDI = "\u2068", "\u2069"
_OPENERS = frozenset("\u2066\u2067\u2068")  # LRI, RLI, FSI


#: Paragraph separators (bidi class B): a paragraph ends every isolate, embedding and
#: override opened in it, so a wrapper around them would stop at the first one and a
#: control after it would reach the text that follows the string.
_PARAGRAPH = re.compile("([\n\r\x1c-\x1e\x85\u2029])")


def _needs_isolation(text: str) -> bool:
    return any(ch == _LRM or unicodedata.bidirectional(ch) in _BIDI_CLASSES for ch in text)


def _wrap(text: str) -> str:
    if not _needs_isolation(text):
        return text
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch in _OPENERS:
            depth += 1
        elif ch == _PDI:
            if depth == 0:
                ch = "\ufffd"
            else:
                depth -= 1
        out.append(ch)
    return _FSI + "".join(out) + _PDI * depth + _PDI


def isolate(value: str) -> str:
    """``value`` as a bidi isolate (FIRST STRONG ISOLATE … POP DIRECTIONAL ISOLATE, what
    ``<bdi>`` does, valid in HTML text and attributes, in a PDF's text and in a
    spreadsheet cell) when it holds a right-to-left letter, a bidi mark or a bidi
    control, so that nothing in it (a U+202E in an id, a reason, a name) can reorder the
    text around it; unchanged otherwise (plain text stays byte for byte as it was).

    Inside, a PDI that would close the wrapper early becomes U+FFFD, and isolates left
    open are closed (a PDI also ends every embedding and override opened in it).  A
    string of several paragraphs (a line break, U+2029 …) is isolated paragraph by
    paragraph, the separators kept, since a paragraph's end would close one wrapper
    around the whole early."""
    if not _needs_isolation(value):
        return value
    parts = _PARAGRAPH.split(value)
    return "".join(part if i % 2 else _wrap(part) for i, part in enumerate(parts))


def isolate_stored(value: object) -> object:
    """The Jinja ``finalize`` hook of every template environment that shows stored text
    (the portal's pages, the reports): a plain ``str`` (an id, a name, a reason, a
    cause) comes back :func:`isolate`-d; anything else (numbers, ``None``, markup that
    a filter or the caller built, which isolates what it shows) comes back unchanged.
    Escaping happens after, as usual."""
    if type(value) is str:
        return isolate(value)
    return value
