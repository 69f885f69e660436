"""HTML from the package's Jinja2 templates, and PDF from that same HTML with WeasyPrint.

The HTML is self-contained (styles inline, charts inline SVG, no links to fetch).  The
PDF renderer adds one stylesheet of ``@font-face`` rules pointing at the DejaVu fonts
shipped in ``reports/static/fonts`` (so the PDF never depends on the fonts installed on
the machine) and refuses to fetch any URL other than those package files.

Reproducibility: the PDF's creation and modification dates come from ``<meta
name="dcterms.created">`` / ``dcterms.modified`` in the HTML (the report's as-of
instant), its file identifier is derived from the HTML's SHA-256, and nothing random is
written, so the same HTML gives byte-identical PDF bytes with the same WeasyPrint,
pydyf, Pango and HarfBuzz versions (the fonts are subset by HarfBuzz).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from ledger.errors import InvariantBroken
from yoco_records.textsafe import isolate

__all__ = [
    "STATIC",
    "TEMPLATES",
    "environment",
    "html_to_pdf",
    "isolated",
    "isolated_text",
    "render_template",
    "shown",
]

PACKAGE = Path(__file__).resolve().parent
TEMPLATES = PACKAGE / "templates"
STATIC = PACKAGE / "static"
FONTS = STATIC / "fonts"

#: Name of the PDF attachment holding a report's machine-readable figures block.
FIGURES_ATTACHMENT = "yoco-report-figures.json"

_lock = threading.Lock()
log = logging.getLogger(__name__)
_FIGURES_RE = re.compile(
    r'<script type="application/json" id="yoco-report-figures">(.*?)</script>', re.S
)
_CREATED_RE = re.compile(r'<meta name="dcterms.created" content="([^"]+)">')


def isolated(value: str) -> Markup:
    """Stored text as report markup: escaped and, when it holds right-to-left text or a
    bidi control, a bidi isolate twice over, as ``<bdi>`` around the FSI … PDI of
    ``yoco_records.textsafe.isolate``.  Browsers honour either; WeasyPrint lays each
    line of a wrapped paragraph out anew, so FSI … PDI alone lose their opening half
    when a line breaks inside them and an override in the text then reverses the rest
    of the line after it, while the ``<bdi>`` box still bounds it.  Plain text comes
    back escaped and otherwise unchanged."""
    text = isolate(value)
    if text == value:
        return escape(value)
    return Markup("<bdi>{}</bdi>").format(text)


def isolated_text(value: str) -> Markup:
    """Stored text for a place where no element may stand (the ``<title>``, an
    attribute): escaped, and ``yoco_records.textsafe.isolate``-d (characters only)."""
    return escape(isolate(value))


def shown(value: object) -> object:
    """The ``finalize`` of the report templates: a plain string (a customer name, a
    contract id, a job, a cause, a reason) becomes :func:`isolated` markup; numbers,
    ``None`` and markup built by the caller come back unchanged.  A stored string for
    the ``<title>`` or an attribute goes through the ``isolated_text`` filter first."""
    if type(value) is str:
        return isolated(value)
    return value


@cache
def environment() -> jinja2.Environment:
    """The Jinja2 environment of the report templates (autoescaped, strict undefined),
    every plain string shown a bidi isolate (:func:`shown`: a customer name, a contract
    id, a job, a cause or a reason holding U+202E cannot reorder the report around it,
    in the HTML or in the PDF)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=shown,
    )
    env.filters["isolated_text"] = isolated_text
    return env


@cache
def stylesheet() -> str:
    """The report's CSS (screen and print), inlined into every HTML report."""
    return (STATIC / "report.css").read_text(encoding="utf-8")


def render_template(name: str, context: dict[str, Any]) -> str:
    """Render template ``name`` with ``context``; deterministic for equal contexts."""
    return environment().get_template(name).render(**context, stylesheet=stylesheet())


def _font_face_css() -> str:
    faces = [
        ("Yoco Report Sans", "normal", "DejaVuSans.ttf"),
        ("Yoco Report Sans", "bold", "DejaVuSans-Bold.ttf"),
        ("Yoco Report Mono", "normal", "DejaVuSansMono.ttf"),
    ]
    return "\n".join(
        f'@font-face {{ font-family: "{family}"; font-weight: {weight}; '
        f'src: url("{(FONTS / file).as_uri()}"); }}'
        for family, weight, file in faces
    )


def _package_path(url: str) -> Path | None:
    """The package static file ``url`` names, or None for any other URL."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path)).resolve()
    if path.is_relative_to(STATIC) and path.is_file():
        return path
    return None


@cache
def _fetcher() -> Any:
    """A WeasyPrint URL fetcher that serves the package's static files and nothing else."""
    from weasyprint.urls import URLFetcher, URLFetcherResponse

    class PackageFetcher(URLFetcher):
        def fetch(self, url: str, headers: Any = None) -> Any:
            path = _package_path(url)
            if path is None:
                raise ValueError(f"reports fetch nothing from outside the package: {url!r}")
            return URLFetcherResponse(url, body=path.read_bytes())

    return PackageFetcher(fail_on_errors=True)


@cache
def warn_without_harfbuzz_subset() -> bool:
    """Log a warning (once per process) when HarfBuzz's subsetter is missing; True if so.

    Without ``libharfbuzz-subset0`` WeasyPrint falls back to fontTools to subset the
    embedded fonts, which makes every PDF much slower to render (the figure is in
    docs/benchmarks-reports.md); the PDFs themselves stay correct.
    """
    from weasyprint.text import ffi

    if getattr(ffi, "harfbuzz_subset", None) is not None:
        return False
    log.warning(
        "libharfbuzz-subset0 is not installed: PDF reports render about twice as slowly "
        "(WeasyPrint subsets fonts with fontTools instead). Install it "
        "(apt-get install libharfbuzz-subset0, or bash scripts/setup)."
    )
    return True


@cache
def _pdf_resources() -> tuple[Any, Any]:
    from weasyprint import CSS
    from weasyprint.text.fonts import FontConfiguration

    font_config = FontConfiguration()
    css = CSS(string=_font_face_css(), font_config=font_config, url_fetcher=_fetcher())
    return css, font_config


def html_to_pdf(html: str) -> bytes:
    """Render ``html`` (a report from :func:`render_template`) to PDF bytes.

    Promises: A4 pages as the HTML's print CSS lays them out, fonts embedded from the
    package, no URL fetched outside it, and the same bytes for the same HTML (file
    identifier from the HTML's SHA-256; dates from the HTML's ``dcterms`` meta tags).
    """
    from weasyprint import HTML, Attachment

    warn_without_harfbuzz_subset()
    attachments = []
    block = _FIGURES_RE.search(html)
    if block is not None:
        # The machine-readable figures travel inside the PDF too, as an attached file
        # (yoco-verify reads it and checks the visible text against it); its dates are
        # the report's own, so the same HTML still gives the same PDF bytes.
        created = _CREATED_RE.search(html)
        when = (
            datetime.fromisoformat(created.group(1).replace("Z", "+00:00"))
            if created
            else datetime(2000, 1, 1, tzinfo=UTC)
        )
        attachments.append(
            Attachment(
                string=block.group(1).strip(),
                name=FIGURES_ATTACHMENT,
                description="yoco report figures (yoco-report-figures/v1)",
                created=when,
                modified=when,
            )
        )
    with _lock:  # one FontConfiguration per process; WeasyPrint is not thread-safe
        css, font_config = _pdf_resources()
        identifier = hashlib.sha256(html.encode("utf-8")).hexdigest()[:32].encode()
        pdf = HTML(string=html, base_url=STATIC.as_uri() + "/", url_fetcher=_fetcher()).write_pdf(
            stylesheets=[css],
            font_config=font_config,
            pdf_identifier=identifier,
            attachments=attachments,
            # a tagged PDF (headings, tables, reading order) is readable with a screen
            # reader and reflows in PDF viewers; PDF/UA also asks for the title and lang
            pdf_tags=True,
        )
    if not isinstance(pdf, bytes):
        raise InvariantBroken("the PDF renderer returned no bytes")
    return pdf
