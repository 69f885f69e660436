"""The PDF renderer warns once when HarfBuzz's subsetter is missing (PDFs still render)."""

from __future__ import annotations

import logging

import pytest

from reports import render


@pytest.fixture
def fresh_warning():
    render.warn_without_harfbuzz_subset.cache_clear()
    yield
    render.warn_without_harfbuzz_subset.cache_clear()


def test_warns_once_without_libharfbuzz_subset(fresh_warning, monkeypatch, caplog) -> None:
    from weasyprint.text import ffi

    monkeypatch.setattr(ffi, "harfbuzz_subset", None)
    html = "<html><body><p>x</p></body></html>"
    with caplog.at_level(logging.WARNING, logger="reports.render"):
        first = render.html_to_pdf(html)
        second = render.html_to_pdf(html)
    assert first.startswith(b"%PDF") and first == second
    warnings = [r for r in caplog.records if "libharfbuzz-subset0" in r.getMessage()]
    assert len(warnings) == 1, caplog.records
    assert "twice as slowly" in warnings[0].getMessage()


def test_no_warning_with_libharfbuzz_subset(fresh_warning, caplog) -> None:
    from weasyprint.text import ffi

    assert ffi.harfbuzz_subset is not None, "libharfbuzz-subset0 is a set-up requirement"
    with caplog.at_level(logging.WARNING, logger="reports.render"):
        render.html_to_pdf("<html><body><p>x</p></body></html>")
    assert not [r for r in caplog.records if "libharfbuzz-subset0" in r.getMessage()]
