"""The verifier's copies of yoco's pure modules are the originals (one home per rule).

``verifier/yoco_verify/shared`` is written by ``scripts/vendor_verifier.py``; a change to
an original without rerunning the script fails here, naming the file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("vendor_verifier", REPO / "scripts" /
                                                  "vendor_verifier.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_copy_equals_its_original_and_nothing_else_is_there() -> None:
    script = _script()
    want = script.expected()
    have = {p for p in script.TARGET.rglob("*.py")}
    assert have == set(want), sorted(str(p) for p in have ^ set(want))
    stale = [str(p.relative_to(REPO)) for p, text in want.items()
             if p.read_text(encoding="utf-8") != text]
    assert not stale, f"rerun python scripts/vendor_verifier.py: {stale}"
    # Only the imports of the three shared packages differ from the originals.
    for rel in script.MODULES:
        copy = (script.TARGET / rel).read_text(encoding="utf-8").splitlines()[2:]
        orig = (REPO / rel).read_text(encoding="utf-8").splitlines()
        diff = [(a, b) for a, b in zip(copy, orig, strict=True) if a != b]
        assert all(a == b.replace(" ledger", " yoco_verify.shared.ledger", 1)
                   .replace(" billing", " yoco_verify.shared.billing", 1)
                   .replace(" yoco_records", " yoco_verify.shared.yoco_records", 1)
                   for a, b in diff), diff


def test_the_verifier_imports_nothing_of_yoco() -> None:
    # Its modules import only the standard library, its dependencies and itself.
    import ast

    for path in (REPO / "verifier" / "yoco_verify").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and
                     not node.level else [])
            for name in names:
                assert name.split(".")[0] not in {"ledger", "billing", "yoco_records", "yoco",
                                                  "reports", "web", "alerts", "runtime"}, (
                    path, name)
