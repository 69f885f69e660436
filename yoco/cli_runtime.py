"""``yoco run`` and ``yoco drain``: the command line of the migration runtime.

Records go to the ledger when ``--contract`` names a contract (the spec
``yoco.sink:ledger_sink`` is built inside the supervisor process, on
``DATABASE_URL`` or the embedded PostgreSQL); without a contract they go to
``RUN_DIR/records.jsonl``; ``--sink`` overrides both.  ``register(app,
default_sink=...)`` lets a caller replace that choice.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from runtime.detection import NODE_FLOOR_S  # pure, no torch: the option's default

if TYPE_CHECKING:
    from runtime.sink import RecordSink, SinkSpec

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
        target="yoco.sink:ledger_sink",
        kwargs={"database_url": ctx.settings.sink_database_url or ctx.settings.database_url},
    )


#: ``YOCO_PREFORK=0``: start the spare zygote as a new process (``python -m runtime.zygote``)
#: rather than forking it from ``yoco run`` (the peer bench/zygote_bench.py measures
#: against; a way round, should the fork ever misbehave somewhere).
PREFORK_ENV = "YOCO_PREFORK"


def set_default_sink(hook: SinkHook) -> None:
    """Make ``hook()`` the sink spec ``yoco run`` uses when ``--sink`` is not given."""
    global _default_sink
    _default_sink = hook


def run(
    ctx: typer.Context,
    script: Path = typer.Argument(..., exists=True, dir_okay=False,
                                  help="Training script (uses runtime.Job; with --transparent, "
                                       "a plain torch.distributed script)."),
    workers: int = typer.Option(2, "--workers", "-n", min=1,
                                help="Data-parallel workers (ranks)."),
    spares: int = typer.Option(1, "--spares", "-s", min=0,
                               help="Hot spares: started, torch imported, waiting."),
    shards: int = typer.Option(
        1, "--shards", min=1,
        help="HSDP: ranks per replica group (the script shards its model with FSDP2 over "
             "runtime.hsdp.shard_mesh()); must divide --workers. 1: plain data parallel."),
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
        help="Fault to inject: kill:rank=K:step=T[:phase=P][:micro=M] (P: forward, "
             "backward, reduce (default), optimizer, checkpoint; M: the micro-batch), "
             "raise:rank=K:step=T, warn:rank=K:step=T[:signal=CAUSE], drain:rank=K:step=T, "
             "killall:step=T, linger:rank=K:step=T[:seconds=S], "
             "slow:rank=K:step=T[:seconds=S], lag:rank=K:step=0[:seconds=S] (the spare "
             "taking rank K waits before it receives the state)."),
    signal_file: Path | None = typer.Option(
        None, "--signal-file", help="JSONL file of injected telemetry signals/readings."),
    signal_command: str | None = typer.Option(
        None, "--signal-command", help="Command printing telemetry JSON lines when run."),
    nvml: bool = typer.Option(True, "--nvml/--no-nvml", help="Read GPU health via NVML."),
    progress_every: float = typer.Option(10.0, "--progress-every", min=0.01,
                                         help="Seconds between job_progress records."),
    fork_spares: bool = typer.Option(
        True, "--fork-spares/--cold-spares",
        help="Fork the workers and spares (replacements too) from a process that has "
             "already imported torch (a replacement is ready in well under a second) "
             "or start each as a new process (3-10 s)."),
    hang_floor: float = typer.Option(
        0.4, "--hang-floor", min=0.1,
        help="Step watchdog: a worker is hung after max(FLOOR, FACTOR x the longest of "
             "the recent step times) seconds without a committed step while its peers "
             "wait for it (3 s until 32 steps were seen, for checkpoint steps and at the "
             "job's end); it is then killed and replaced (cause hang). Raise it if one "
             "rank legitimately does much more work in steps rarer than one in 256 (e.g. "
             "evaluation on rank 0)."),
    hang_factor: float = typer.Option(2.0, "--hang-factor", min=1.0,
                                      help="Step watchdog factor (see --hang-floor)."),
    hang_stopped_factor: float = typer.Option(
        3.0, "--hang-stopped-factor", min=0.0,
        help="A worker (or a host on this machine) that /proc shows stopped, with no "
             "committed step for max(0.25 s, FACTOR x steady step time), is hung and "
             "replaced at once (a stopped process cannot be merely slow). 0: off."),
    deliver_timeout: float = typer.Option(
        30.0, "--deliver-timeout", min=0.1,
        help="Seconds to wait at the end for the sink to acknowledge every record; what "
             "is not delivered by then stays in the outbox (exit status 3)."),
    resume: bool = typer.Option(False, "--resume",
                                help="Continue JOB_ID from its newest checkpoint after a "
                                     "supervisor crash, and deliver its pending records."),
    nnodes: str | None = typer.Option(
        None, "--nnodes", envvar="YOCO_NNODES",
        help="Multi-node: N training nodes, or N:+S with S spare nodes (every host runs "
             "the same command; node rank 0 also runs the coordinator)."),
    node_rank: int | None = typer.Option(
        None, "--node-rank", min=0,
        help="This host's node rank (default: from SLURM_NODEID or JOB_COMPLETION_INDEX)."),
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint",
        help="HOST[:PORT] of the coordinator (node rank 0's host; port 29400 by default; "
             "default: the first host of SLURM_JOB_NODELIST, or JOBNAME-0.SERVICE)."),
    node_name: str | None = typer.Option(
        None, "--node-name", help="This host's name in the records (default: host name)."),
    nproc_per_node: int = typer.Option(
        1, "--nproc-per-node", min=1,
        help="Multi-node: processes (GPUs) per node; replaces --workers/--spares."),
    node_timeout: float = typer.Option(
        2.0, "--node-timeout", min=0.1,
        help="Multi-node: the longest a silent node is waited for: a node whose agent "
             "has not beaten for this long is hung: it is fenced and replaced by a spare "
             "node (cause hang). Sooner once the job's steps are known: after max("
             "--node-floor, 3 x the longest recent gap between heartbeats, the step "
             "watchdog's deadline). A coordinator that hears from no majority of its "
             "nodes waits this long, then stops (exit 4; --resume after the heal)."),
    node_floor: float = typer.Option(
        NODE_FLOOR_S, "--node-floor", min=0.1,
        help="Multi-node: a node is never lost for a silence shorter than this (see "
             "--node-timeout; heartbeats are 0.1 s apart). Raise it on a network that "
             "drops out for longer without losing a host."),
    pool: str | None = typer.Option(
        None, "--pool", envvar="YOCO_POOL",
        help="Multi-node: HOST:PORT of a host pool shared with other jobs (yoco pool): "
             "with no spare left this job borrows a host of a lower-priority job, and "
             "lends its own hosts to higher-priority ones."),
    priority: int = typer.Option(
        0, "--priority", help="This job's priority in the --pool (higher borrows from lower)."),
    transparent: bool = typer.Option(
        False, "--transparent",
        help="Model-transparent mode: SCRIPT is an unmodified torch.distributed script "
             "(DistributedDataParallel, an optimizer, a DataLoader with a "
             "DistributedSampler); the runtime discovers its state (docs/runtime.md)."),
) -> None:
    """Launch a fault-tolerant data-parallel training job (like torchrun).

    Exit status: 0 finished and every record delivered; 1 the job failed; 2 bad
    input; 3 the job finished but some records were not delivered (listed, with why:
    refused by the sink, or the sink unreachable); 4 (multi-node) the coordinator was
    lost (an agent's host) or found itself cut off from a majority of its hosts (the
    coordinator's host): resume with --resume on every host.

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

    if fork_spares and os.environ.get(PREFORK_ENV, "1") != "0":
        from runtime.zygote import prefork

        # Here, torch imported and no thread started: the spare zygote forked now has
        # torch already (runtime.zygote). It must run before anything starts a thread.
        prefork()
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
        argv = [str(script), *ctx.args]
        if transparent:
            from runtime.transparent import LAUNCHER

            if shards != 1:
                raise ConfigError("--transparent runs plain data parallel (no --shards)")
            argv = [LAUNCHER, *argv]
        cfg = LaunchConfig(
            script=argv[0], args=argv[1:], workers=workers, spares=spares,
            shards=shards,
            contract_id=contract, job_id=job_id, checkpoint_every=checkpoint_every,
            checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
            runs_root=str(runs_root) if runs_root else None, sink=spec,
            faults=[parse_fault(f) for f in inject],
            signal_file=str(signal_file) if signal_file else None,
            signal_command=signal_command, nvml=nvml, progress_interval_s=progress_every,
            fork_spares=fork_spares, resume=resume, deliver_timeout_s=deliver_timeout,
            hang_floor_s=hang_floor, hang_factor=hang_factor,
            hang_stopped_factor=hang_stopped_factor)
        identity = None
        if nnodes is not None or node_rank is not None:
            import socket

            from runtime.identity import NodeFlags, resolve_identity

            identity = resolve_identity(
                NodeFlags(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                          node_name=node_name), os.environ, socket.gethostname())
            if cfg.job_id is None and os.environ.get("SLURM_JOB_ID"):
                cfg.job_id = f"slurm-{os.environ['SLURM_JOB_ID']}"
            cfg.node_timeout_s, cfg.node_floor_s = node_timeout, node_floor
            cfg.pool, cfg.priority = pool, priority  # checked in run_node (nodes known)
        elif pool is not None:
            raise ConfigError("--pool (spare borrowing) needs a multi-node job (--nnodes)")
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    from runtime.errors import OutboxError
    from runtime.supervisor import EXIT_UNDELIVERED

    try:
        if identity is not None:
            from runtime.nodes import run_node

            code, node_result = run_node(identity, cfg, nproc=nproc_per_node)
            if node_result is None:  # an agent's host: the coordinator reports the job
                raise typer.Exit(code)
            result = node_result
        else:
            result = launch(cfg)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except OutboxError as exc:
        typer.echo(f"error: {exc}; the job was not started", err=True)
        raise typer.Exit(2) from exc
    from runtime.supervisor import EXIT_CUT_OFF

    state = {0: "finished", EXIT_CUT_OFF: "STOPPED, the coordinator cut off from its hosts "
             "(nothing recorded against them; `yoco run --resume` on every host continues "
             "it)"}.get(result.exit_code, "FAILED")
    typer.echo(f"job {result.job_id}: {state} at "
               f"step {result.final_step}; {len(result.recoveries)} recoveries; run dir "
               f"{result.run_dir}")
    if result.checkpoint_error:
        ce = result.checkpoint_error
        typer.echo(f"warning: {ce['failed_writes']} checkpoint write(s) failed, the latest at "
                   f"step {ce['step']}: {ce['error']}", err=True)
    problems = result.delivery_report()
    undelivered = not result.delivered or result.rescued is not None
    if problems and not undelivered:  # the outbox's disk failed, the sink took it all
        typer.echo(f"warning: {problems[-1]}", err=True)
    elif problems:
        typer.echo(f"error: record(s) of job {result.job_id} not delivered "
                   "(they stay in the outbox):", err=True)
        for line in problems[:20]:
            typer.echo(f"  {line}", err=True)
        if len(problems) > 20:
            typer.echo(f"  ... and {len(problems) - 20} more (yoco outbox list "
                       f"{result.job_id})", err=True)
        typer.echo(f"  deliver pending ones with `yoco outbox deliver {result.job_id}`; "
                   f"fix and re-send refused ones with `yoco outbox resend {result.job_id}`",
                   err=True)
        if result.exit_code == 0:
            raise typer.Exit(EXIT_UNDELIVERED)
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
    the drained worker then exits. The move is recorded as a planned failure event
    (dated when the request was made). A job started with --spares 0 has no spare: the
    drain is refused (exit 2). While a spare is being started the request waits; the
    job's status.json lists it under moves_pending. Exit 1: no such job or worker.
    """
    from runtime.control import default_runs_root
    from runtime.control import drain as file_drain
    from runtime.errors import DrainError, NoSpareError

    try:
        name = file_drain(job, worker, runs_root=runs_root or default_runs_root(),
                          reason=reason)
    except NoSpareError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except DrainError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"drain of {name} requested for job {job}")


outbox_app = typer.Typer(
    help="Inspect a job's outbox: records pending delivery and dead letters (records the "
         "sink refused for good), and deliver or re-send them.",
    no_args_is_help=True)


def _run_dir(job: str, runs_root: Path | None) -> Path:
    from runtime.control import default_runs_root

    run_dir = (runs_root or default_runs_root()) / job
    if not (run_dir / "outbox").is_dir():
        typer.echo(f"error: no outbox for job {job!r} in {run_dir.parent}", err=True)
        raise typer.Exit(2)
    return run_dir


def _sink_for_run(run_dir: Path, sink: str | None, sink_arg: list[str]) -> RecordSink:
    """The sink ``yoco run`` would use for this job: ``--sink``, else the hook, else the
    ledger for the job's contract, else RUN_DIR/records.jsonl."""
    import json

    from runtime.errors import ConfigError
    from runtime.sink import JsonlFileSink, parse_sink_spec

    try:
        kwargs = dict(a.split("=", 1) for a in sink_arg)
    except ValueError:
        raise typer.BadParameter("--sink-arg takes KEY=VALUE") from None
    try:
        if sink:
            return parse_sink_spec(sink, kwargs).build()
        spec = _default_sink() if _default_sink is not None else None
        if spec is None:
            try:
                status = json.loads((run_dir / "status.json").read_text())
            except (OSError, ValueError):
                status = {}
            spec = _ledger_sink_for(str(status.get("contract_id", "default")))
        if spec is None:
            return JsonlFileSink(run_dir / "records.jsonl")
        return spec.build()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


_SINK_HELP = ("Where records go: jsonl:PATH or module:factory (default: as 'yoco run' "
              "chose: the ledger for the job's contract, else RUN_DIR/records.jsonl).")


@outbox_app.command("list")
def outbox_list(
    job: str = typer.Argument(..., help="Job ID."),
    runs_root: Path | None = typer.Option(None, "--runs-root", envvar="YOCO_RUN_DIR",
                                          help="Folder of run directories."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
) -> None:
    """List the records of JOB not yet delivered: pending ones and dead letters.

    Exit status 0 when nothing is undelivered, 3 otherwise.
    """
    import json
    from datetime import UTC, datetime

    from runtime.outbox import Outbox
    from yoco_records.textsafe import safe_text

    box = Outbox(_run_dir(job, runs_root) / "outbox")
    pending, dead = box.pending(limit=1_000_000), box.dead_letters()
    for rec in pending:
        row = {"state": "pending", "event_id": rec["event_id"], "kind": rec["kind"]}
        typer.echo(json.dumps(row) if as_json else safe_text(
            f"pending      {rec['kind']:<13} {rec['event_id']}"))
    for d in dead:
        at = datetime.fromtimestamp(d.at, UTC).isoformat(timespec="seconds")
        row = {"state": "dead_letter", "event_id": d.event_id,
               "kind": d.record.get("kind"), "reason": d.reason, "at": at}
        typer.echo(json.dumps(row) if as_json else safe_text(
            f"dead letter  {d.record.get('kind')!s:<13} {d.event_id}  refused {at}: {d.reason}"))
    if not as_json:
        typer.echo(f"{len(pending)} pending, {len(dead)} dead letter(s)")
    if pending or dead:
        raise typer.Exit(3)


@outbox_app.command("resend")
def outbox_resend(
    job: str = typer.Argument(..., help="Job ID."),
    event_ids: list[str] = typer.Argument(None, help="Dead letters to re-send (default: "
                                                      "all), by event_id."),
    runs_root: Path | None = typer.Option(None, "--runs-root", envvar="YOCO_RUN_DIR",
                                          help="Folder of run directories."),
    sink: str | None = typer.Option(None, "--sink", help=_SINK_HELP),
    sink_arg: list[str] = typer.Option([], "--sink-arg", help="KEY=VALUE for the sink."),
) -> None:
    """Deliver JOB's dead letters again (after fixing what the sink refused, e.g. adding
    the contract), one by one in outbox order. Exit 0 if all went, 3 if not."""
    from runtime.errors import OutboxError
    from runtime.outbox import Outbox, resend_dead_letters

    run_dir = _run_dir(job, runs_root)
    box = Outbox(run_dir / "outbox")
    if not box.dead_letters():
        typer.echo(f"job {job} has no dead letters")
        return
    try:
        results = resend_dead_letters(box, _sink_for_run(run_dir, sink, sink_arg),
                                      event_ids or None)
    except OutboxError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for r in results:
        typer.echo(f"{'delivered' if r.delivered else 'NOT delivered'}  {r.kind:<13} "
                   f"{r.event_id}{'' if r.delivered else '  ' + r.reason}")
    if not all(r.delivered for r in results):
        raise typer.Exit(3)


@outbox_app.command("deliver")
def outbox_deliver(
    job: str = typer.Argument(..., help="Job ID."),
    runs_root: Path | None = typer.Option(None, "--runs-root", envvar="YOCO_RUN_DIR",
                                          help="Folder of run directories."),
    sink: str | None = typer.Option(None, "--sink", help=_SINK_HELP),
    sink_arg: list[str] = typer.Option([], "--sink-arg", help="KEY=VALUE for the sink."),
) -> None:
    """Deliver JOB's pending records now (e.g. after the ledger was unreachable).
    Permanently refused ones become dead letters. Exit 0 if nothing is left, 3 if not."""
    from runtime.outbox import Deliverer, Outbox

    run_dir = _run_dir(job, runs_root)
    box = Outbox(run_dir / "outbox")
    deliverer = Deliverer(box, _sink_for_run(run_dir, sink, sink_arg))
    sent = 0
    try:
        while box.pending_count():
            sent += deliverer.deliver_once()
    except Exception as exc:  # an outage: say so; the records stay pending
        typer.echo(f"error: sink unreachable ({type(exc).__name__}: {exc}); "
                   f"{box.pending_count()} record(s) still pending", err=True)
        raise typer.Exit(3) from exc
    dead = box.dead_letters()
    typer.echo(f"{sent} record(s) handled; 0 pending; {len(dead)} dead letter(s)")
    if dead:
        raise typer.Exit(3)


def pool(
    port: int = typer.Option(29500, "--port", min=1, max=65535,
                             help="Port of the pool store (it listens on every address, "
                                  "as the coordinator's store does)."),
) -> None:
    """Serve a host pool shared by several jobs' coordinators (spare borrowing).

    Run it once, then start every job sharing it with yoco run --nnodes N ... --pool
    HOST:PORT --priority P: a job with no spare left borrows a host of a job of lower
    priority, which goes on narrower until the host comes back.
    """
    from runtime.borrowing import serve_pool

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve_pool(port)


_RUN_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def register(app: typer.Typer, *, default_sink: SinkHook | None = None) -> None:
    """Add ``run`` and ``drain`` to ``app``; ``default_sink`` becomes the sink hook."""
    if default_sink is not None:
        set_default_sink(default_sink)
    app.command("run", context_settings=_RUN_SETTINGS)(run)
    app.command("drain")(drain)
    app.command("pool")(pool)
    app.add_typer(outbox_app, name="outbox")


app = typer.Typer(help="Fault-tolerant training runtime.", no_args_is_help=True)
register(app)


if __name__ == "__main__":
    sys.exit(app())
