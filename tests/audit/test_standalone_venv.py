"""The verifier installed alone: its folder copied out of the repository, built there into
a wheel, installed in a fresh virtual environment holding only it and its three
dependencies, checks a real downloaded archive and recomputes a real report.

The wheel installs no top-level name but ``yoco_verify`` (the pure modules it shares with
yoco are copied under ``yoco_verify.shared``).  No network: the wheel is built without
build isolation; the dependencies
(cryptography with cffi, pypdf, rfc8785) are made visible to the fresh environment from
this interpreter's own copies through a .pth file, and nothing else is.  The environment
must not be able to import the database, web or torch stacks, nor yoco's other modules.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPS = ("cryptography", "cffi", "_cffi_backend", "pycparser", "pypdf", "rfc8785")


def _dep_paths() -> list[Path]:
    out = []
    for name in DEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            if name in ("cffi", "_cffi_backend", "pycparser"):  # cryptography's, if it uses them
                continue
            raise AssertionError(f"{name} is not installed here")
        origin = Path(spec.origin)
        out.append(origin.parent if origin.name == "__init__.py" else origin)
    return out


@pytest.mark.slow
def test_fresh_venv_with_only_the_verifier_recomputes_a_real_report(
    world: dict[str, Any], tmp_path: Path
) -> None:
    # The verifier's folder alone, out of the repository (no ../ledger beside it).
    alone = tmp_path / "elsewhere" / "verifier"
    shutil.copytree(REPO / "verifier", alone,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(wheels), str(alone)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("yoco_verify-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    assert tops == {"yoco_verify", "yoco_verify-0.1.0.dist-info"}, tops
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    clean_env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
                 "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LANG": "C.UTF-8"}
    subprocess.run([str(py), "-m", "pip", "install", "--no-index", "--no-deps", str(wheel)],
                   check=True, capture_output=True, env=clean_env, timeout=600)
    deps = tmp_path / "deps"
    deps.mkdir()
    for p in _dep_paths():
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, deps / p.name)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    (site / "yoco-verify-deps.pth").write_text(str(deps) + "\n")

    empty = tmp_path / "cwd"  # python -c imports from its working directory: keep it empty
    empty.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, env=clean_env,
                              cwd=empty, timeout=600)

    # Only the verifier was installed, and nothing of the heavy stacks or of yoco's own
    # packages is importable.
    probe = run(str(py), "-c",
                "import importlib.util as u, yoco_verify.shared.ledger.merkle as m;"
                "print(sorted(n for n in ('sqlalchemy','fastapi','torch','psycopg','weasyprint',"
                "'yoco','web','reports','runtime','ledger','billing','yoco_records') "
                "if u.find_spec(n)));"
                "print(m.__file__)")
    assert probe.returncode == 0, probe.stderr
    found, where = probe.stdout.splitlines()
    assert found == "[]", found
    assert where.startswith(str(site)), where
    meta = next(site.glob("yoco_verify-*.dist-info")) / "METADATA"
    requires = sorted(ln.split(":", 1)[1].strip() for ln in meta.read_text().splitlines()
                      if ln.startswith("Requires-Dist:"))
    assert [r.split(">")[0] for r in requires] == ["cryptography", "pypdf", "rfc8785"]

    stem = world["reports"]["C-TIP 2026-03"]
    res = run(str(env_dir / "bin" / "yoco-verify"), str(world["archives"]["C-TIP"]),
              "--public-key", str(world["key_file"]),
              "--report", f"{stem}.pdf", "--report", f"{stem}.html")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Resolution rate (year to date): 80.95 % (17 of 21)  matches" in res.stdout
    assert res.stdout.rstrip().endswith("every figure matches")
    # The same installed verifier refuses a report with one figure changed.
    html = Path(f"{stem}.html").read_text()
    forged = tmp_path / "forged.html"
    forged.write_text(html.replace('"covered": 6', '"covered": 5', 1)
                      .replace('"month": "6"', '"month": "5"', 1))
    res = run(str(env_dir / "bin" / "yoco-verify"), str(world["archives"]["C-TIP"]),
              "--public-key", world["key"], "--report", str(forged))
    assert res.returncode == 1, res.stdout
    assert "DIFFERS" in res.stdout and "is recorded by no report entry" in res.stdout
    assert "PYTHONPATH" not in clean_env  # the repository is not on the path

    # The witness runs from the same installation (nothing of the server needed).
    key = tmp_path / "witness.key"
    res = run(str(env_dir / "bin" / "yoco-verify"), "witness", "keygen", "w.example/w",
              "--key", str(key))
    assert res.returncode == 0, res.stderr
    vkey = res.stdout.strip()
    assert vkey.startswith("w.example/w+")
    serve = subprocess.Popen(
        [str(env_dir / "bin" / "yoco-verify"), "witness", "serve", "--state",
         str(tmp_path / "wstate"), "--key", str(key), "--listen", "127.0.0.1:0",
         "--log", f"yoco.example/ledger/*={world['key']}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean_env, cwd=empty)
    try:
        assert serve.stdout is not None
        assert f"witness {vkey} on http://127.0.0.1:" in serve.stdout.readline()
    finally:
        serve.kill()
        serve.wait(timeout=60)
