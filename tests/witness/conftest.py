"""Fixtures of the witness tests: real ``yoco-verify witness serve`` processes on
127.0.0.1, and the report tests' composition root and seeding."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from yoco_verify.witness import generate_key

from tests.reports.conftest import app_ctx, engine_, seed

__all__ = ["WitnessProcess", "app_ctx", "engine_", "seed", "witnesses"]

VERIFIER = Path(__file__).resolve().parents[2] / "verifier"
_READY = re.compile(r"witness (\S+) on http://127\.0\.0\.1:(\d+)/")


@dataclass
class WitnessProcess:
    """One witness server process: its key, state folder, logs, port; restartable."""

    name: str
    folder: Path
    logs: list[str]
    port: int = 0
    vkey: str = ""
    proc: subprocess.Popen[str] | None = None
    stderr: list[str] = field(default_factory=list)

    @property
    def key_file(self) -> Path:
        return self.folder / "witness.key"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> str:
        """This witness as a YOCO_WITNESSES entry."""
        return f"{self.url} {self.vkey}"

    def start(self) -> None:
        """Start the process (on the same port after the first start); wait until it
        listens."""
        if not self.key_file.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self.vkey = generate_key(self.name, self.key_file).key.to_text()
        args = [sys.executable, "-c", "from yoco_verify.cli import main; main()", "witness",
                "serve", "--state", str(self.folder / "state"), "--key", str(self.key_file),
                "--listen", f"127.0.0.1:{self.port}"]
        for spec in self.logs:
            args += ["--log", spec]
        # the verifier package from this checkout (its own folder, as a customer installs
        # it), whether or not it is installed in this environment
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(VERIFIER), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = _READY.search(line)
        assert m, f"witness did not start: {line!r} (exit {self.proc.poll()})"
        assert m.group(1) == self.vkey
        self.port = int(m.group(2))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process with ``sig`` (SIGKILL: a crash) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)
        self.proc = None


@pytest.fixture
def witnesses(tmp_path: Path) -> Iterator[list[WitnessProcess]]:
    """Make witness processes: ``make(name, logs)``; all are killed at the end."""
    made: list[WitnessProcess] = []
    yield made
    for w in made:
        w.kill()


def start_witness(made: list[WitnessProcess], folder: Path, name: str,
                  logs: list[str]) -> WitnessProcess:
    """Start one witness process (killed by the ``witnesses`` fixture)."""
    w = WitnessProcess(name, folder / name.replace("/", "_"), logs)
    made.append(w)
    w.start()
    return w
