"""The code says what a rule means, not where it was asked for: no reference to the
project's issue tracker ("issue 10, item 5") in any Python file -- a reader of the code
has no tracker to look it up in."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: "issue 25", "Issues 10", "issue #7" -- not "issue 250,000.00 USD" (the verb, a sum).
TRACKER_REF = re.compile(r"\bissues? #?\d+\b(?![.,]\d)", re.IGNORECASE)
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its own examples below


def test_no_python_file_refers_to_the_tracker() -> None:
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    assert len(files) > 100, "git ls-files found too few Python files to judge"
    hits = [f"{name}:{n}: {line.strip()}"
            for name in files if (ROOT / name).exists() and name != SELF
            for n, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
            if TRACKER_REF.search(line)]
    assert not hits, "tracker references (say what they mean instead):\n" + "\n".join(hits)


def test_the_pattern_tells_a_reference_from_the_verb() -> None:
    assert TRACKER_REF.search("the causal order (issue 10, item 5)")
    assert TRACKER_REF.search("Issue 27: credits")
    assert TRACKER_REF.search("see issue #7")
    assert not TRACKER_REF.search("Close the year and issue 250,000.00 USD")
    assert not TRACKER_REF.search("issue a token")
