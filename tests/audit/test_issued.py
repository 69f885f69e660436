"""yoco-verify accepts a report only as issued: its exact bytes must be those a ``report``
entry of the log records (``html_sha256``/``pdf_sha256``).

Every forgery below keeps the figures block and the text a parser extracts true, so the
recomputation alone would pass it (the tests assert so): only the digest catches it."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from pathlib import Path
from typing import Any

from tests.audit.conftest import verify

ISSUED = "issued: SHA-256 {} is recorded by no report entry of this log"


def _check_refused(world: dict[str, Any], capsys: Any, name: str, html: str) -> str:
    path = world["tmp"] / name
    path.write_text(html, encoding="utf-8")
    digest = hashlib.sha256(html.encode("utf-8")).hexdigest()
    code, out = verify(capsys, world["archives"]["C-TIP"], "-k", world["key"], "--report", path)
    assert code == 1, out
    assert ISSUED.format(digest) in out, out
    # The figures and the extracted text are untouched: nothing else is reported.
    assert "DIFFERS" not in out and "visible text" not in out, out
    assert "FAILED: 1 problem(s)" in out, out
    return out


def test_the_issued_bytes_are_accepted_from_the_downloaded_archive(world, capsys) -> None:
    stem = world["reports"]["C-TIP 2026-03"]
    code, out = verify(capsys, world["archives"]["C-TIP"], "-k", world["key_file"],
                       "--report", f"{stem}.html", "--report", f"{stem}.pdf")
    assert code == 0, out
    assert len(re.findall(r"issued: its SHA-256 [0-9a-f]{64} is recorded by report entry \d+",
                          out)) == 2, out
    assert out.rstrip().endswith("every figure matches")


def _html(world: dict[str, Any]) -> str:
    return Path(f"{world['reports']['C-TIP 2026-03']}.html").read_text(encoding="utf-8")


def test_css_generated_content_forgery_is_refused(world, capsys) -> None:
    html = _html(world)
    cell = '<tr data-figure="covered"><th>Covered failures</th><td class="num">6</td>'
    assert cell in html
    # The page shows 5 (CSS generated content); the text, and the hidden span, say 6.
    forged = html.replace(cell, cell.replace(
        '<td class="num">6</td>', '<td class="num" data-v="5"><span hidden>6</span></td>'))
    forged = forged.replace("</head>", "<style>td[data-v]::before{content:attr(data-v)}</style>"
                            "</head>", 1)
    _check_refused(world, capsys, "css.html", forged)
    _browser_shows(world["tmp"] / "css.html", "5")


def _browser_shows(path: Path, want: str) -> None:
    """What a browser renders in the covered-failures month cell (Chromium, headless)."""
    from playwright.sync_api import sync_playwright

    from tests.web.test_e2e_browser import CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(path.as_uri())
            shown = page.evaluate(
                "() => { const td = document.querySelector('tr[data-figure=covered] td');"
                " const span = td.querySelector('span');"
                " return [getComputedStyle(td, '::before').content,"
                "         span ? getComputedStyle(span).display : ''] }")
        finally:
            browser.close()
    assert shown == [f'"{want}"', "none"], shown


def test_hidden_copy_forgery_is_refused(world, capsys) -> None:
    html = _html(world)
    table = re.search(r'<table class="summary".*?</table>', html, re.S)
    assert table is not None, "the figures table"
    lie = table.group(0).replace(
        '<th>Covered failures</th><td class="num">6</td>',
        '<th>Covered failures</th><td class="num">5</td>')
    assert lie != table.group(0)
    forged = html.replace(table.group(0), lie + "<div hidden>" + table.group(0) + "</div>")
    _check_refused(world, capsys, "hidden.html", forged)


def test_banner_verdict_chart_row_and_month_edits_are_refused(world, capsys) -> None:
    html = _html(world)
    edits = {
        "banner-verdict": ('<span class="verdict bad">below so far</span>',
                           '<span class="verdict good">on track</span>'),
        "banner-rate": ("80.95 % of covered failures resolved so far",
                        "90.48 % of covered failures resolved so far"),
        "verdict-colour": ('<span class="verdict bad">missed</span>',
                           '<span class="verdict good">missed</span>'),
        "chart-bar": ('width="38" height="52"', 'width="38" height="152"'),
        "failure-row": ('<td class="num">120</td>', '<td class="num">0</td>'),
        "month": ("<h1>Monthly SLA report — March 2026</h1>",
                  "<h1>Monthly SLA report — April 2026</h1>"),
    }
    for name, (old, new) in edits.items():
        assert old in html, name
        _check_refused(world, capsys, f"{name}.html", html.replace(old, new, 1))


def test_pdf_overdraw_is_refused(world, capsys) -> None:
    """A white box and new digits drawn over the page: the old glyphs stay in the text
    a parser extracts, and the attached block is untouched."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, NameObject

    src = Path(f"{world['reports']['C-TIP 2026-03']}.pdf")
    w = PdfWriter(clone_from=PdfReader(src))
    page = w.pages[0]
    res = page["/Resources"].get_object()
    if "/Font" not in res:
        res[NameObject("/Font")] = DictionaryObject()
    res["/Font"].get_object()[NameObject("/FForged")] = w._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica")}))
    draw = DecodedStreamObject()
    draw.set_data(b"q 1 1 1 rg 300 400 60 20 re f 0 0 0 rg "
                  b"BT /FForged 12 Tf 305 405 Td (50) Tj ET Q")
    contents = page["/Contents"]
    parts = list(contents) if isinstance(contents.get_object(), list) else [contents]
    page[NameObject("/Contents")] = ArrayObject([*parts, w._add_object(draw)])
    buf = io.BytesIO()
    w.write(buf)
    forged = world["tmp"] / "overdraw.pdf"
    forged.write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    code, out = verify(capsys, world["archives"]["C-TIP"], "-k", world["key"], "--report", forged)
    assert code == 1 and ISSUED.format(digest) in out, out
    assert "DIFFERS" not in out and "visible text" not in out, out
    # Any other byte change of the PDF too (one byte of its trailing comment).
    data = bytearray(src.read_bytes())
    data[-2] ^= 0x20
    other = world["tmp"] / "byte.pdf"
    other.write_bytes(bytes(data))
    code, out = verify(capsys, world["logs"]["C-TIP"], "-k", world["key"], "--report", other)
    assert code == 1 and ISSUED.format(hashlib.sha256(bytes(data)).hexdigest()) in out, out


def test_a_report_never_issued_is_refused(world, app_ctx, seed, capsys) -> None:
    """A report rendered later, over a newer checkpoint (a draft), was never recorded."""
    from ledger.checkpoints import sign_all
    from reports import monthly as rm
    from tests.audit.conftest import yoco
    from yoco.database import unit_of_work

    with unit_of_work(app_ctx.engine) as s:
        draft = rm.build_monthly_report(s, "C-TIP", 2026, 3)
    assert draft.html_sha256 != hashlib.sha256(
        Path(f"{world['reports']['C-TIP 2026-03']}.html").read_bytes()).hexdigest()
    path = world["tmp"] / "draft.html"
    path.write_bytes(draft.html_bytes)
    with unit_of_work(app_ctx.engine) as s:
        sign_all(s, app_ctx.signer, app_ctx.settings.log_origin)
    log = world["tmp"] / "log-now"
    yoco("ledger", "export-log", "C-TIP", "--out", str(log))
    code, out = verify(capsys, log, "-k", world["key"], "--report", path)
    assert code == 1 and ISSUED.format(draft.html_sha256) in out, out


def test_a_log_under_another_contracts_origin_is_refused(world, app_ctx, capsys) -> None:
    from ledger import note

    log = world["tmp"] / "foreign"
    shutil.copytree(world["logs"]["C-TIP"], log)
    cp = note.parse_checkpoint(note.unverified_text((log / "checkpoint").read_text()))
    other = cp.origin.rsplit("/", 1)[0] + "/C-CLOSED"
    (log / "checkpoint").write_text(note.sign_checkpoint(app_ctx.signer, other, cp.size, cp.root))
    code, out = verify(capsys, log, "-k", world["key"])
    assert code == 1
    assert f"log: the checkpoint's origin {other!r} is not contract 'C-TIP''s log" in out, out
