"""Imports point one way, and the portal's modules form no cycle (docs/architecture.md).

``yoco → web → reports → billing → ledger → yoco_records`` (and ``web → alerts →
billing``); ``runtime`` imports none of
them but ``yoco_records`` (it reports through a sink the composition root names), and
``adapters`` only the runtime.
Every import statement counts, wherever it stands (a function-local import is still a
dependency); only ``if TYPE_CHECKING:`` blocks, which never run, are left out.
The source is read with :mod:`ast`: nothing is imported to check it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Each checked package and the project packages it may import (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "yoco_records": frozenset(),
    "ledger": frozenset({"yoco_records"}),
    "billing": frozenset({"ledger", "yoco_records"}),
    "reports": frozenset({"billing", "ledger", "yoco_records"}),
    "web": frozenset({"alerts", "reports", "billing", "ledger", "yoco_records"}),
    # Operators' alerts: read billing's verdicts and the ledger; web and yoco read them.
    "alerts": frozenset({"billing", "ledger", "yoco_records"}),
    "runtime": frozenset({"yoco_records"}),
    # Reporters for other fault-tolerance stacks (torchrun, TorchFT): the runtime's
    # records and outbox, nothing of the ledger's side.
    "adapters": frozenset({"runtime", "yoco_records"}),
    # The standalone verifier imports none of them: it carries copies of the pure modules
    # it needs under yoco_verify.shared (scripts/vendor_verifier.py).
    "yoco_verify": frozenset(),
}
PROJECT = frozenset({*ALLOWED, "yoco", "migrations"})


def _package_dir(package: str) -> Path:
    return ROOT / "verifier" / package if package == "yoco_verify" else ROOT / package


def _module_name(path: Path) -> str:
    verifier = ROOT / "verifier"
    rel = path.relative_to(verifier if path.is_relative_to(verifier) else ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module named by an import statement (absolute), with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            # Skip the block's body (never run) but not its else branch.
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, node.lineno
            # ``from web import render`` names the module web.render
            for alias in node.names:
                yield f"{target}.{alias.name}", node.lineno


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(_package_dir(package).rglob("*.py"))}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_package_imports_a_package_above_it(package: str) -> None:
    wrong: dict[str, str] = {}
    for module, path in _modules(package).items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line in _imports(tree, module, path.name == "__init__.py"):
            top = target.split(".")[0]
            if top in PROJECT and top != package and top not in ALLOWED[package]:
                wrong.setdefault(f"{path.relative_to(ROOT)}:{line}", target)
    assert not wrong, "\n".join(f"{where} imports {what}" for where, what in wrong.items())


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize(
    "package",
    ["web", "reports", "alerts", "billing", "ledger", "runtime", "adapters", "yoco"],
)
def test_modules_of_a_package_import_each_other_without_a_cycle(package: str) -> None:
    modules = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, _ in _imports(tree, module, path.name == "__init__.py"):
            if target in modules and target != module and target != package:
                graph[module].add(target)
    cycle = _cycle(graph)
    assert cycle is None, " → ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    # The check itself: a function-local import closing a loop is found.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    tree = ast.parse("def f():\n    from web.deps import x\n")
    assert ("web.deps", 2) in set(_imports(tree, "web.render", False))
    checking = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import yoco\n")
    assert not any(t == "yoco" for t, _ in _imports(checking, "web.x", False))


#: The ORM modules of the domain packages: the portal reads through their query
#: functions (ledger.contracts, ledger.journal, ledger.checkpoints, ledger.projections,
#: billing.services, billing.disputes), never through the models themselves.
DOMAIN_MODELS = ("ledger.models", "billing.models")
#: The one exception: the portal's own tables (users, sessions, tokens) are declared on
#: the ledger's declarative base, so that one metadata (and one migration history)
#: holds every table.
SHARED_BASE = {("web.models", "ledger.models"), ("web.models", "ledger.models.Base")}


def test_the_portal_reads_the_domain_through_query_functions_not_orm_models() -> None:
    wrong: dict[str, str] = {}
    for module, path in _modules("web").items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line in _imports(tree, module, path.name == "__init__.py"):
            named = any(target == m or target.startswith(m + ".") for m in DOMAIN_MODELS)
            if named and (module, target) not in SHARED_BASE:
                wrong.setdefault(f"{path.relative_to(ROOT)}:{line}", target)
    assert not wrong, "\n".join(f"{where} imports {what}" for where, what in wrong.items())


def test_the_orm_check_finds_a_model_import() -> None:
    # The check itself: a function-local import of a model is found; a type-only one
    # (never run) is not.
    local = ast.parse("def f():\n    from billing.models import Credit\n")
    assert ("billing.models.Credit", 2) in set(_imports(local, "web.x", False))
    typed = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from ledger.models import Failure\n"
    )
    assert not any(t.startswith("ledger.models") for t, _ in _imports(typed, "web.x", False))
