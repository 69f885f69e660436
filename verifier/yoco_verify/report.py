"""Read a monthly report (HTML or PDF): its figures block and the text a reader sees.

The report embeds its figures as a ``yoco-report-figures/v1`` JSON block (HTML: a
``<script type="application/json" id="yoco-report-figures">``; PDF: the attached file
``yoco-report-figures.json``).  The block alone could say one thing while the page says
another, so :func:`check_visible` also checks that the visible text (the HTML without
scripts and styles, or the PDF's extracted text) shows, row by row, the label and the two
values of every figure of the block's table, in order.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from yoco_verify import VerifyError

__all__ = [
    "FIGURES_FORMAT",
    "Report",
    "check_visible",
    "entry_disagrees",
    "file_digest",
    "issued_entry",
    "read_report",
    "visible_text",
]

FIGURES_FORMAT = "yoco-report-figures/v1"
FIGURES_ID = "yoco-report-figures"
FIGURES_ATTACHMENT = "yoco-report-figures.json"
_WS = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Report:
    """A report's figures block, its visible text (white space collapsed) and the
    SHA-256 of its exact bytes (hex), the digest its ``report`` entry records."""

    path: Path
    block: dict[str, Any]
    text: str
    sha256: str


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.block: list[str] | None = None
        self.blocks = 0
        self._skip = 0
        self._in_block = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
            if tag == "script" and dict(attrs).get("id") == FIGURES_ID:
                self._in_block = True
                self.blocks += 1
                self.block = []
        elif tag in ("td", "th", "p", "div", "tr", "br", "li", "pre", "h1", "h2", "h3"):
            self.text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
            self._in_block = False
        elif tag in ("td", "th", "p", "div", "tr", "li"):
            self.text.append(" ")

    def handle_data(self, data: str) -> None:
        if self._in_block and self.block is not None:
            self.block.append(data)
        elif not self._skip:
            self.text.append(data)


def _norm(s: str) -> str:
    return _WS.sub(" ", s).strip()


def _parse_block(raw: str | bytes, path: Path) -> dict[str, Any]:
    try:
        block = json.loads(raw)
    except ValueError as exc:
        raise VerifyError(f"{path.name}: the figures block is not JSON: {exc}") from None
    if not isinstance(block, dict) or block.get("format") != FIGURES_FORMAT:
        raise VerifyError(f"{path.name}: the figures block is not {FIGURES_FORMAT}")
    return block


def file_digest(path: Path) -> str:
    """The SHA-256 (hex) of the file's exact bytes; :class:`VerifyError` if unreadable."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise VerifyError(f"{path}: cannot read: {exc}") from None


def read_report(path: Path) -> Report:
    """Read ``path`` (``.html`` or ``.pdf``, by its first bytes); :class:`VerifyError` when
    it has no figures block or cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VerifyError(f"{path}: cannot read: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if data.startswith(b"%PDF"):
        return _read_pdf(path, data, digest)
    try:
        html = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VerifyError(f"{path.name}: neither a PDF nor UTF-8 HTML") from None
    parser = _Html()
    parser.feed(html)
    parser.close()
    if parser.blocks != 1 or parser.block is None:
        raise VerifyError(
            f"{path.name}: expected exactly one figures block "
            f'(<script id="{FIGURES_ID}">), found {parser.blocks}'
        )
    block = _parse_block("".join(parser.block), path)
    return Report(path, block, _norm("".join(parser.text)), digest)


def visible_text(path: Path) -> str:
    """The text a reader sees in ``path`` (HTML without scripts and styles, or the PDF's
    extracted text), white space collapsed: for a document with no figures block (a
    year-end statement).  :class:`VerifyError` when it cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VerifyError(f"{path}: cannot read: {exc}") from None
    if data.startswith(b"%PDF"):
        import io

        try:
            from pypdf import PdfReader

            pages = PdfReader(io.BytesIO(data)).pages
            return _norm(" ".join(page.extract_text() or "" for page in pages))
        except Exception as exc:  # pypdf raises many kinds on a broken file
            raise VerifyError(f"{path.name}: cannot read the PDF: {exc}") from None
    try:
        html = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VerifyError(f"{path.name}: neither a PDF nor UTF-8 HTML") from None
    parser = _Html()
    parser.feed(html)
    parser.close()
    return _norm("".join(parser.text))


def _read_pdf(path: Path, data: bytes, digest: str) -> Report:
    import io

    try:
        from pypdf import PdfReader

        reader = PdfReader(io.BytesIO(data))
        attached = reader.attachments.get(FIGURES_ATTACHMENT)
        text = " ".join(page.extract_text() or "" for page in reader.pages)
    except Exception as exc:  # pypdf raises many kinds on a broken file
        raise VerifyError(f"{path.name}: cannot read the PDF: {exc}") from None
    if not attached or len(attached) != 1:
        raise VerifyError(
            f"{path.name}: expected exactly one attached {FIGURES_ATTACHMENT}, "
            f"found {len(attached or [])}"
        )
    return Report(path, _parse_block(attached[0], path), _norm(text), digest)


def _occurrences(text: str, needle: str, start: int) -> list[int]:
    out = []
    at = text.find(needle, start)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


def check_visible(report: Report) -> list[str]:
    """Problems where the visible text does not show the block's table, row by row.

    Each row must appear as its label followed directly by the month's and the year's
    values as the block states them, after the previous row.  Letter case is ignored
    (the report's style sets verdicts in capitals; a PDF's text keeps them so).
    """
    problems: list[str] = []
    text = report.text.casefold()
    pos = 0
    rows = report.block.get("rows")
    if not isinstance(rows, list) or not rows:
        return ["the figures block has no rows"]
    for row in rows:
        label, mv, yv = (_norm(str(row.get(k, ""))).casefold() for k in ("label", "month", "year"))
        want = f"{label} {mv} {yv}"
        at = text.find(want, pos)
        if at >= 0:
            pos = at + len(want)
            continue
        # Not shown as stated: say what the page shows after the row's label instead.
        seen = [m for m in _occurrences(text, label + " ", pos)]
        if not seen:
            problems.append(f"{row.get('id')}: the row {label!r} is not in the visible text")
            continue
        after = seen[0] + len(label) + 1  # the first after the previous row: the table
        shown = text[after : after + len(mv) + len(yv) + 12]
        problems.append(
            f"{row.get('id')}: the page shows {label!r} as {shown!r}…, "
            f"the figures block says {mv + ' ' + yv!r}"
        )
    return problems


def issued_entry(digest: str, bodies: Sequence[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The ``report`` entry (its number and body) whose ``html_sha256`` or ``pdf_sha256``
    is ``digest``, the SHA-256 (hex) of a report file's exact bytes.

    The digest covers every byte (page, banner, chart, style, a PDF's drawing), so a
    report is accepted only as it was issued.  :class:`VerifyError` when no entry of the
    log records these bytes.
    """
    for seq, b in enumerate(bodies):
        if b.get("kind") == "report" and digest in (b.get("html_sha256"), b.get("pdf_sha256")):
            return seq, b
    raise VerifyError(
        f"SHA-256 {digest} is recorded by no report entry of this log: these are not the "
        "bytes of a report the operator issued (a byte of the file was changed, or it was "
        "never issued)"
    )


def entry_disagrees(entry: dict[str, Any], block: dict[str, Any]) -> list[str]:
    """Where a ``report`` entry and the figures block of the bytes it records disagree on
    the month or the checkpoint (an empty list when they agree)."""
    return [
        f"the report entry says {mine} {entry.get(mine)!r}, its figures block says "
        f"{theirs} {block.get(theirs)!r}"
        for mine, theirs in (
            ("month", "month"),
            ("checkpoint_tree_size", "tree_size"),
            ("checkpoint_root_hash", "root_hash"),
        )
        if entry.get(mine) != block.get(theirs)
    ]
