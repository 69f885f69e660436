#!/usr/bin/env python3
"""Copy the pure modules the standalone verifier needs under ``verifier/yoco_verify/shared``.

The verifier is its own distribution (``pip install ./verifier`` from a copy of that
folder alone) and installs no top-level package but ``yoco_verify``, so it cannot point
into the repository's ``ledger/``, ``billing/`` and ``yoco_records/``.  Their pure modules
stay at home there (the yoco distribution imports them; yoco does not ship yoco_verify,
so the import cannot point the other way); this script writes a copy of each under
``yoco_verify.shared`` with only its imports of those three packages rewritten, and
``tests/audit/test_vendored.py`` holds every copy equal to what this script would write
now.  After changing one of the originals, run ``python scripts/vendor_verifier.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["MODULES", "TARGET", "expected", "main"]

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "verifier" / "yoco_verify" / "shared"
PREFIX = "yoco_verify.shared"

#: The verifier's closure of pure modules (no database, web framework or torch).
MODULES = (
    "yoco_records/canonical.py",
    "yoco_records/schema.py",
    "yoco_records/textsafe.py",
    "ledger/cosign.py",
    "ledger/errors.py",
    "ledger/merkle.py",
    "ledger/note.py",
    "ledger/records.py",
    "ledger/tiles.py",
    "billing/display.py",
    "billing/inforce.py",
    "billing/money.py",
    "billing/sla.py",
    "billing/terms.py",
    "billing/verdict.py",
    "billing/years.py",
)

_IMPORT = re.compile(r"^(\s*)(from|import) (ledger|billing|yoco_records)\b", re.MULTILINE)
_HEADER = (
    "# A copy of {src}, written by scripts/vendor_verifier.py: edit the original and\n"
    "# rerun the script (tests/audit/test_vendored.py holds this copy equal to it).\n"
)
_INIT = '"""Copies of the yoco modules the verifier needs (see scripts/vendor_verifier.py)."""\n'


def expected() -> dict[Path, str]:
    """Every file of ``yoco_verify.shared`` as the script writes it, by its path."""
    out: dict[Path, str] = {TARGET / "__init__.py": _INIT}
    for rel in MODULES:
        text = (REPO / rel).read_text(encoding="utf-8")
        body = _IMPORT.sub(lambda m: f"{m[1]}{m[2]} {PREFIX}.{m[3]}", text)
        package = rel.split("/")[0]
        out[TARGET / package / "__init__.py"] = _INIT
        out[TARGET / rel] = _HEADER.format(src=rel) + body
    return out


def main() -> int:
    """Write the copies (and remove any file of the folder that is no longer one)."""
    want = expected()
    for path in TARGET.rglob("*.py"):
        if path not in want:
            path.unlink()
    for path, text in want.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
