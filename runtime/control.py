"""Operator control of a running job through its run directory (``yoco drain``).

A drain request is a small JSON file written atomically into ``RUN_DIR/control/``; the
supervisor polls that folder. Files, not a socket, so that a request survives a
supervisor restart and needs no open port.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from runtime.errors import DrainError, NoSpareError


def default_runs_root() -> Path:
    """Return the folder holding one run directory per job (``$YOCO_RUN_DIR`` wins)."""
    env = os.environ.get("YOCO_RUN_DIR")
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "yoco" / "runs"


def file_drain_request(control_dir: Path, worker: str, *, reason: str = "maintenance") -> Path:
    """Atomically file a request to move the job off ``worker``; return the file's path."""
    control_dir.mkdir(parents=True, exist_ok=True)
    name = f"drain-{uuid.uuid4().hex}.json"
    tmp = control_dir / f".{name}.tmp"
    tmp.write_text(json.dumps({"worker": worker, "reason": reason, "t": time.time()}))
    os.replace(tmp, control_dir / name)
    return control_dir / name


def take_requests(control_dir: Path) -> list[dict[str, Any]]:
    """Return and delete every pending request in ``control_dir`` (oldest first)."""
    out: list[dict[str, Any]] = []
    if not control_dir.is_dir():
        return out
    for path in sorted(control_dir.glob("drain-*.json"), key=lambda p: p.stat().st_mtime):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
        path.unlink(missing_ok=True)
    return out


def read_status(run_dir: Path) -> dict[str, Any]:
    """Return the status the supervisor last wrote in ``run_dir`` (DrainError if none)."""
    path = run_dir / "status.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DrainError(f"no running job in {run_dir} ({exc})") from exc
    return data


def write_json_atomically(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically (a temporary file renamed over
    it). On any error (a full or read-only disk) the temporary file is removed and the
    ``OSError`` raised: ``path`` is then untouched, never half written."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w") as fh:
            fh.write(json.dumps(data, indent=2))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Atomically replace ``run_dir/status.json`` (see :func:`write_json_atomically`)."""
    write_json_atomically(run_dir / "status.json", status)


def drain(job_id: str, worker: str, *, runs_root: Path | None = None,
          reason: str = "maintenance") -> str:
    """File a planned migration of job ``job_id`` off ``worker`` (a name like ``w1`` or a
    rank number); return the worker name the request targets.

    Raises :class:`DrainError` if the job is not running or has no such worker. The move
    itself happens at the job's next step boundary.
    """
    run_dir = (runs_root or default_runs_root()) / job_id
    status = read_status(run_dir)
    if status.get("state") != "running":
        raise DrainError(f"job {job_id} is {status.get('state')}, not running")
    members: list[str] = status.get("members", [])
    name = worker
    if worker.isdigit():
        rank = int(worker)
        if rank >= len(members):
            raise DrainError(f"job {job_id} has no rank {rank} (world size {len(members)})")
        name = members[rank]
    elif worker not in members:
        raise DrainError(f"job {job_id} has no active worker {worker!r}; active: "
                         f"{', '.join(members)}")
    if not status.get("spares") and not status.get("spares_configured", 1):
        # Nothing will ever take the worker's place: accepting the request would let the
        # operator take the node down, turning a planned move into an unplanned failure.
        raise NoSpareError(f"job {job_id} has no spare to move {name} onto (it runs with "
                           "--spares 0): the drain is refused and nothing was moved; "
                           "taking the node down now fails the worker (a rollback)")
    file_drain_request(run_dir / "control", name, reason=reason)
    return name
