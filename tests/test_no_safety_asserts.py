"""No guard is an ``assert``: ``python -O`` removes every ``assert``
statement, so a check that protects data must be a named error that survives it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The product's packages (the runtime, the verifier and the tests keep their own rules).
PACKAGES = ("ledger", "billing", "web", "yoco", "alerts", "reports", "yoco_records")


def test_no_assert_statement_in_the_products_packages() -> None:
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            found += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Assert)]
    assert found == [], f"use a named error (ledger.errors.ensure/InvariantBroken): {found}"


def test_a_guard_still_raises_under_python_O() -> None:
    """The Merkle fold and an id's version check raise their named errors with -O."""
    code = (
        "from ledger import merkle, ids\n"
        "from ledger.errors import TreeSizeError, InvariantBroken, ensure\n"
        "assert False, 'asserts are off under -O'\n"
        "try:\n"
        "    merkle._fold([], lambda l, i: b'')\n"
        "except TreeSizeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
        "try:\n"
        "    ensure(False, 'kept')\n"
        "except InvariantBroken as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "kept"
