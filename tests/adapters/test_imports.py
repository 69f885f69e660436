"""Imports point one way: an adapter runs inside someone else's training script, so it
uses the record rules and the outbox and nothing of the ledger, billing, reports, web or
the composition root -- and no torch (the script brings its own)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_PROJECT = ("adapters", "yoco_records", "runtime.records", "runtime.outbox",
                   "runtime.sink", "runtime.errors")
FORBIDDEN = ("ledger", "billing", "reports", "web", "yoco", "migrations", "torch", "torchft")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            names.add(base)
            if base == "runtime":  # `from runtime import records`
                names |= {f"runtime.{a.name}" for a in node.names}
    return names


def test_adapters_import_only_the_record_rules_and_the_outbox() -> None:
    files = sorted((ROOT / "adapters").glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"{path.name} imports {name}"
            if top in ("runtime",) and name != "runtime":
                assert name in ALLOWED_PROJECT, f"{path.name} imports {name}"


def test_importing_the_adapters_loads_no_torch_and_no_ledger() -> None:
    code = ("import sys, adapters.torchrun, adapters.torchft, adapters.common\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{FORBIDDEN!r})\n"
            "print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
