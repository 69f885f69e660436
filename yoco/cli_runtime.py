"""``yoco run`` and ``yoco drain``: the command line of the migration runtime.

Records go to the ledger when ``--contract`` names a contract (the spec
``yoco.sink:ledger_sink`` is built inside the supervisor process, on
``DATABASE_URL`` or the embedded PostgreSQL); without a contract they go to
``RUN_DIR/records.jsonl``; ``--sink`` overrides both.  ``register(app,
default_sink=...)`` lets a caller replace that choice.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from runtime.sink import SinkSpec

# The runtime (and torch, ~3 s to import) is imported inside the commands, so that
# every other ``yoco`` command starts without it.
SinkHook = Callable[[], "SinkSpec | None"]
_default_sink: SinkHook | None = None  # None: the ledger for a named contract


def _ledger_sink_for(contract: str) -> SinkSpec | None:
    """The ledger sink for ``contract`` (checked to exist now), or None for ``default``."""
    if contract == "default":
        return None
    from ledger.contracts import get_contract
    from ledger.errors import UnknownContract
    from runtime.errors import ConfigError
    from runtime.sink import SinkSpec
    from yoco.app import App
    from yoco.database import unit_of_work

    ctx = App()
    try:
        ctx.require_schema()
        with unit_of_work(ctx.engine) as session:
            get_contract(session, contract)
    except UnknownContract:
        raise ConfigError(
            f"unknown contract {contract!r}: create it first (yoco contracts add), or "
            "pass --sink jsonl:PATH to keep the records in a file"
        ) from None
    finally:
        ctx.close()
    return SinkSpec(
        target="yoco.sink:ledger_sink", kwargs={"database_url": ctx.settings.database_url}
    )


def set_default_sink(hook: SinkHook) -> None:
    """Make ``hook()`` the sink spec ``yoco run`` uses when ``--sink`` is not given."""
    global _default_sink
    _default_sink = hook


def run(
    ctx: typer.Context,
    script: Path = typer.Argument(..., exists=True, dir_okay=False,
                                  help="Training script (uses runtime.Job)."),
    workers: int = typer.Option(2, "--workers", "-n", min=1,
                                help="Data-parallel workers (ranks)."),
    spares: int = typer.Option(1, "--spares", "-s", min=0,
                               help="Hot spares: started, torch imported, waiting."),
    contract: str = typer.Option("default", "--contract", envvar="YOCO_CONTRACT_ID",
                                 help="Contract ID written on every record."),
    job_id: str | None = typer.Option(None, "--job-id",
                                      help="Job ID (default: generated). Reuse with --resume."),
    checkpoint_every: int = typer.Option(
        0, "--checkpoint-every", min=0,
        help="Write a checkpoint every K steps (rollback fallback); 0 = never."),
    checkpoint_dir: Path | None = typer.Option(
        None, "--checkpoint-dir", help="Checkpoint folder (default RUN_DIR/checkpoints)."),
    runs_root: Path | None = typer.Option(
        None, "--runs-root", envvar="YOCO_RUN_DIR",
        help="Folder of run directories (status, logs, outbox, control)."),
    sink: str | None = typer.Option(
        None, "--sink",
        help="Where records go: jsonl:PATH or module:factory (default: the ledger when "
             "--contract names a contract, else RUN_DIR/records.jsonl)."),
    sink_arg: list[str] = typer.Option(
        [], "--sink-arg", help="KEY=VALUE keyword argument for a module:factory sink."),
    inject: list[str] = typer.Option(
        [], "--inject",
        help="Fault to inject: kill:rank=K:step=T, raise:rank=K:step=T, "
             "warn:rank=K:step=T[:signal=CAUSE], drain:rank=K:step=T, killall:step=T."),
    signal_file: Path | None = typer.Option(
        None, "--signal-file", help="JSONL file of injected telemetry signals/readings."),
    signal_command: str | None = typer.Option(
        None, "--signal-command", help="Command printing telemetry JSON lines when run."),
    nvml: bool = typer.Option(True, "--nvml/--no-nvml", help="Read GPU health via NVML."),
    progress_every: float = typer.Option(10.0, "--progress-every", min=0.01,
                                         help="Seconds between job_progress records."),
    fork_spares: bool = typer.Option(
        True, "--fork-spares/--cold-spares",
        help="Start replacement spares by forking a process that has already imported "
             "torch (ready in well under a second) or as new processes (3-10 s)."),
    resume: bool = typer.Option(False, "--resume",
                                help="Continue JOB_ID from its newest checkpoint after a "
                                     "supervisor crash, and deliver its pending records."),
) -> None:
    """Launch a fault-tolerant data-parallel training job (like torchrun).

    Starts WORKERS processes of SCRIPT plus SPARES hot spares. A killed worker is
    replaced by a spare that receives the full training state from a healthy replica
    (live migration, no lost step); with no spare or no replica left the job rolls back
    to its last checkpoint. Every start, progress, failure and outcome is written to a
    durable outbox and delivered to the sink. Arguments after SCRIPT go to the script.
    """
    from runtime.errors import ConfigError
    from runtime.faults import parse_fault
    from runtime.sink import parse_sink_spec
    from runtime.supervisor import LaunchConfig, launch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        kwargs = dict(a.split("=", 1) for a in sink_arg)
    except ValueError:
        raise typer.BadParameter("--sink-arg takes KEY=VALUE") from None
    try:
        spec: SinkSpec | None
        if sink:
            spec = parse_sink_spec(sink, kwargs)
        elif _default_sink is not None:
            spec = _default_sink()
        else:
            spec = _ledger_sink_for(contract)
        cfg = LaunchConfig(
            script=str(script), args=list(ctx.args), workers=workers, spares=spares,
            contract_id=contract, job_id=job_id, checkpoint_every=checkpoint_every,
            checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
            runs_root=str(runs_root) if runs_root else None, sink=spec,
            faults=[parse_fault(f) for f in inject],
            signal_file=str(signal_file) if signal_file else None,
            signal_command=signal_command, nvml=nvml, progress_interval_s=progress_every,
            fork_spares=fork_spares, resume=resume)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    result = launch(cfg)
    typer.echo(f"job {result.job_id}: {'finished' if result.exit_code == 0 else 'FAILED'} at "
               f"step {result.final_step}; {len(result.recoveries)} recoveries; run dir "
               f"{result.run_dir}")
    if not result.delivered:
        typer.echo("warning: some records are still in the outbox (sink unreachable); "
                   "rerun with --resume to deliver them", err=True)
    raise typer.Exit(result.exit_code)


def drain(
    job: str = typer.Argument(..., help="Job ID (as printed by yoco run)."),
    worker: str = typer.Argument(..., help="Worker name (w1) or data-parallel rank (1)."),
    reason: str = typer.Option("maintenance", "--reason", help="Why (goes in the record)."),
    runs_root: Path | None = typer.Option(None, "--runs-root", envvar="YOCO_RUN_DIR",
                                          help="Folder of run directories."),
) -> None:
    """Move a running job off WORKER at its next step boundary (planned migration).

    A hot spare takes the worker's rank and receives the state from a healthy replica;
    the drained worker then exits. The move is recorded as a planned failure event.
    """
    from runtime.control import default_runs_root
    from runtime.control import drain as file_drain
    from runtime.errors import DrainError

    try:
        name = file_drain(job, worker, runs_root=runs_root or default_runs_root(),
                          reason=reason)
    except DrainError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"drain of {name} requested for job {job}")


_RUN_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def register(app: typer.Typer, *, default_sink: SinkHook | None = None) -> None:
    """Add ``run`` and ``drain`` to ``app``; ``default_sink`` becomes the sink hook."""
    if default_sink is not None:
        set_default_sink(default_sink)
    app.command("run", context_settings=_RUN_SETTINGS)(run)
    app.command("drain")(drain)


app = typer.Typer(help="Fault-tolerant training runtime.", no_args_is_help=True)
register(app)


if __name__ == "__main__":
    sys.exit(app())
