"""docs/security.md names a test for every claim: each one it names must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def named_tests(text: str) -> list[tuple[str, str]]:
    """(file, test) pairs of ``tests/x.py::test_a`` and the ``::test_b`` that follow it."""
    out: list[tuple[str, str]] = []
    current = ""
    for m in re.finditer(r"`(tests/[\w/]+\.py)?::(\w+)`", text):
        current = m.group(1) or current
        assert current, f"{m.group(0)} names no file before it"
        out.append((current, m.group(2)))
    return out


def test_every_test_the_threat_model_names_exists() -> None:
    doc = (REPO / "docs" / "security.md").read_text()
    named = named_tests(doc)
    assert len(named) >= 40
    missing = []
    for file, test in named:
        path = REPO / file
        if not path.exists() or not re.search(rf"^(async )?def {test}\(", path.read_text(),
                                              re.MULTILINE):
            missing.append(f"{file}::{test}")
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
