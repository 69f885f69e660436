"""Installs that fit each machine: the base dependencies, the ``runtime`` extra (a training
node) and the ``server`` extra, as pyproject.toml declares them and yoco/extras.py maps
them; a training node's code imports nothing of the server's; a server command run
without the server extra says which extra to install.

The source is read with :mod:`ast` (nothing imported to check it); pyproject.toml with
:mod:`tomllib`. The installed check (a fresh virtual environment holding ``.[runtime]``)
is tests/test_runtime_install.py.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.test_architecture import _imports, _modules
from yoco.extras import MODULE_EXTRA, missing_extra

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    """The distribution name of a requirement string, normalised (PEP 503)."""
    name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _dists_of_module() -> dict[str, set[str]]:
    return {module: {_name(d) for d in dists}
            for module, dists in importlib.metadata.packages_distributions().items()}


def test_every_mapped_module_comes_with_the_extra_it_is_mapped_to() -> None:
    extras = {k: {_name(r) for r in v} for k, v in PROJECT["optional-dependencies"].items()}
    base = {_name(r) for r in PROJECT["dependencies"]}
    dists = _dists_of_module()
    wrong = []
    for module, extra in MODULE_EXTRA.items():
        owners = dists.get(module, set())
        if not owners:  # an alternative import name of a distribution (python-multipart)
            continue
        # Listed in that extra, or brought by one it lists (starlette by fastapi).
        listed = extras[extra]
        brought = {_name(r) for d in listed for r in
                   (importlib.metadata.requires(d) or []) if "extra ==" not in r}
        if not owners & (listed | brought):
            wrong.append(f"{module} ({', '.join(sorted(owners))}) is not in [{extra}]")
        if owners & base:
            wrong.append(f"{module} is a base dependency, not only [{extra}]'s")
    assert not wrong, "\n".join(wrong)


def test_every_distribution_of_the_two_extras_is_mapped() -> None:
    dists = _dists_of_module()
    mapped = {d for module in MODULE_EXTRA for d in dists.get(module, set())}
    for extra in ("runtime", "server"):
        missing = {_name(r) for r in PROJECT["optional-dependencies"][extra]} - mapped
        assert not missing, f"[{extra}] distributions yoco/extras.py does not map: {missing}"


def test_the_base_install_brings_nothing_of_the_server_nor_torch() -> None:
    base = {_name(r) for r in PROJECT["dependencies"]}
    heavy = {_name(r) for extra in ("runtime", "server")
             for r in PROJECT["optional-dependencies"][extra]}
    assert not base & heavy, base & heavy
    # numpy is declared once (by the server's risk model).
    everywhere = [_name(r) for group in (PROJECT["dependencies"],
                                         *PROJECT["optional-dependencies"].values())
                  for r in group]
    assert everywhere.count("numpy") == 1


def test_the_bench_extra_is_more_than_torchft() -> None:
    extras = PROJECT["optional-dependencies"]
    assert extras["bench"] != extras["torchft"]
    assert any("runtime" in r and "server" in r for r in extras["bench"]), extras["bench"]


#: A training node's code: every module of these packages, wherever the import stands.
TRAINING_PACKAGES = ("runtime", "adapters", "yoco_records")
#: ...and these modules' top-level imports (their commands import the server lazily, only
#: when a server sink is asked for).
TRAINING_MODULES = ("yoco/cli.py", "yoco/app.py", "yoco/settings.py", "yoco/extras.py",
                    "yoco/cli_runtime.py")


def _server_imports(tree: ast.Module, module: str, is_package: bool,
                    top_level_only: bool) -> list[tuple[str, int]]:
    if top_level_only:
        kept = (ast.Import, ast.ImportFrom, ast.If)  # an If: TYPE_CHECKING or a guard
        tree = ast.Module(body=[n for n in tree.body if isinstance(n, kept)], type_ignores=[])
    return [(target, line) for target, line in _imports(tree, module, is_package)
            if MODULE_EXTRA.get(target.split(".")[0]) == "server"]


@pytest.mark.parametrize("package", TRAINING_PACKAGES)
def test_a_training_nodes_packages_import_nothing_of_the_server(package: str) -> None:
    wrong = []
    for module, path in _modules(package).items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line in _server_imports(tree, module, path.name == "__init__.py", False):
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("rel", TRAINING_MODULES)
def test_the_command_lines_modules_import_the_server_only_inside_its_commands(rel: str) -> None:
    path = ROOT / rel
    module = rel.removesuffix(".py").replace("/", ".")
    found = _server_imports(ast.parse(path.read_text(), rel), module, False, True)
    assert not found, found


def test_a_missing_module_of_an_extra_is_named_with_its_extra() -> None:
    server = missing_extra(ModuleNotFoundError("No module named 'weasyprint'", name="weasyprint"))
    assert server is not None and "pip install 'yoco[server]'" in server and "weasyprint" in server
    runtime = missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch.cuda"))
    assert runtime is not None and "pip install 'yoco[runtime]'" in runtime
    # Anything else missing is a bug, not an install to suggest.
    assert missing_extra(ModuleNotFoundError("No module named 'nope'", name="nope")) is None


# A server command on a machine without the server's modules: an import hook hides them
# (as on a training node that installed yoco[runtime]), then the `yoco` entry point runs.
_HIDE = """
import sys
from importlib.abc import MetaPathFinder
hidden = {hidden!r}
class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
sys.argv = ["yoco", *{argv!r}]
from yoco.cli import main
main()
"""


@pytest.mark.parametrize("argv", [["db", "url"], ["reports", "monthly", "--month", "2026-01",
                                                  "--out", "x"]])
def test_a_server_command_without_the_server_extra_names_the_extra(
        argv: list[str], tmp_path: Path) -> None:
    hidden = sorted(m for m, extra in MODULE_EXTRA.items() if extra == "server")
    run = subprocess.run([sys.executable, "-c", _HIDE.format(hidden=hidden, argv=argv)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{ROOT / 'verifier'}",
                              "YOCO_DATA_DIR": str(tmp_path / "data"), "HOME": str(tmp_path)})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "the 'server' extra" in run.stderr and "pip install 'yoco[server]'" in run.stderr, \
        run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    # The command line itself still works there (its help needs none of the server).
    help_run = subprocess.run(
        [sys.executable, "-c", _HIDE.format(hidden=hidden, argv=["--help"])],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{ROOT / 'verifier'}",
             "HOME": str(tmp_path)})
    assert help_run.returncode == 0 and "run" in help_run.stdout, help_run.stderr
