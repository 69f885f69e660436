"""``yoco serve``, ``yoco users …`` and ``yoco tokens …``: the portal from the command line."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from yoco.cli import application, err, fail, out

if TYPE_CHECKING:
    from yoco.app import App

users_app = typer.Typer(help="Portal users: customers' people, operators, finance.",
                        no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens: ingest tokens for runtimes, read tokens for "
                         "customers' tooling.", no_args_is_help=True)


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    proxy_headers: Annotated[
        bool,
        typer.Option(help="Trust X-Forwarded-Proto/For from a local reverse proxy "
                     "(cookies get Secure when it says https)."),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(min=1, max=64,
                     help="Worker processes (uvicorn workers; about one per CPU core). Each "
                     "keeps its own cache (figures, pages, answers); sessions and rate limits are "
                     "in the database."),
    ] = 1,
    close_due_every: Annotated[
        float,
        typer.Option(min=0, help="Minutes between the background runs that close ended "
                     "contract years and issue their credits (0: off, e.g. when a cron "
                     "entry or CronJob runs 'yoco billing close-due' instead)."),
    ] = 60.0,
) -> None:
    """Run the portal and the JSON API (uvicorn), on the embedded database by default.

    In the background it closes ended contract years and issues their credits (see
    --close-due-every), and signs a checkpoint of every log with new entries every
    YOCO_LEDGER_CHECKPOINT_EVERY_S seconds (default 300). SIGTERM or Ctrl-C stop it
    gracefully: requests in flight finish, and the embedded PostgreSQL is stopped when no
    other yoco process uses it.

    Exit status: 0 stopped (SIGTERM, SIGINT), 2 refused options (e.g. the port is in
    use), 1 the server failed.
    """
    import signal

    from ledger.cadence import describe_interval

    _check_port(host, port)
    with application() as ctx:
        url = ctx.database.url  # starts the embedded server now, before uvicorn
        from yoco.database import redact

        err.print(
            f"database: {redact(ctx.database.portal_url)}", highlight=False, soft_wrap=True
        )
        err.print(f"starting the portal on http://{host}:{port}/"
                  + (f" ({workers} workers)" if workers > 1 else "") + " …", highlight=False)
        _announce_when_accepting(
            host, port, f"portal ready on http://{host}:{port}/  (API schema: "
            "/api/openapi.json)",
        )
        # uvicorn handles SIGTERM gracefully, then restores the previous handler and
        # raises the signal again. With the default handler that would kill this process
        # before `application()` releases its handle on the embedded PostgreSQL; this
        # handler turns it into a normal exit, so the handle is released. A SIGTERM that
        # comes before uvicorn's own handler is in place is noted in `stop` as well (see
        # _sigterm_handler): the server then stops at its first tick.
        stop = threading.Event()
        signal.signal(signal.SIGTERM, _sigterm_handler(stop))
        scheduler = None
        if close_due_every > 0:
            from yoco.scheduler import CloseDueScheduler

            scheduler = CloseDueScheduler(ctx, close_due_every * 60)
            scheduler.start()
            err.print(f"closing ended contract years every {close_due_every:g} min "
                      "(credits issued without a claim)", highlight=False)
        from yoco.scheduler import CheckpointScheduler

        every_s = ctx.settings.checkpoint_every_s
        checkpoints = CheckpointScheduler(ctx, every_s)
        checkpoints.start()
        err.print(f"signing a checkpoint of every log with new entries every "
                  f"{describe_interval(every_s)}", highlight=False)
        try:
            if stop.is_set():
                return  # SIGTERM during the start-up, its SystemExit lost on the way
            _run_uvicorn(ctx, url, workers, stop, options={
                "host": host,
                "port": port,
                "proxy_headers": proxy_headers,
                "forwarded_allow_ips": "127.0.0.1" if proxy_headers else None,
                "access_log": False,
                "log_level": "info",
            })
        finally:
            checkpoints.stop()
            if scheduler is not None:
                scheduler.stop()


def _announce_when_accepting(host: str, port: int, message: str) -> None:
    """Print ``message`` once ``host:port`` accepts a connection (from a daemon thread):
    the address is announced when it works, not while the workers are still starting."""
    import socket
    import threading
    import time

    # a wildcard address is reached through loopback
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104

    def wait() -> None:
        while True:
            try:
                with socket.create_connection((target, port), timeout=1.0):
                    break
            except OSError:
                time.sleep(0.2)
        err.print(message, highlight=False)

    threading.Thread(target=wait, name="yoco-serve-ready", daemon=True).start()


def _sigterm_handler(stop: threading.Event) -> Callable[[int, object], None]:
    """The SIGTERM handler of ``yoco serve``: a normal exit (``SystemExit(0)``), the
    request noted in ``stop`` first.

    Python runs a signal handler between two bytecodes of the main thread, wherever it
    is: when that is inside a garbage-collection callback (a weakref's), the
    ``SystemExit`` is printed as "Exception ignored" and dropped, and a SIGTERM sent
    before uvicorn had put its own handler in place was lost -- the server then ran on
    (seen once in a loaded CI run). The note is not lost: the server checks it every
    tick (:class:`_StoppableServer`) and ``serve`` before starting it."""

    def handler(signum: int, frame: object) -> None:
        stop.set()
        raise SystemExit(0)

    return handler


def _check_port(host: str, port: int) -> None:
    """Exit 2 with a clear message when ``host:port`` cannot be listened on."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        fail(f"--host {host!r}: {exc}")
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(addr)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server "
                 "running there? choose another --port)")


def _run_uvicorn(ctx: App, url: str, workers: int, stop: threading.Event, *,
                 options: dict[str, Any]) -> None:
    import os

    import uvicorn

    if workers == 1:
        from yoco.webapp import portal_app

        server = _stoppable_server(uvicorn.Config(portal_app(ctx), **options), stop)
        with contextlib.suppress(KeyboardInterrupt):  # (as uvicorn.run)
            server.run()
        if not server.started and not stop.is_set():
            raise SystemExit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits
        return
    # Worker processes build their own app from the environment: point them at the
    # database this process has started (the embedded server lives as long as we do)
    # and at the same data folder (the cookie secret and the signing keys).
    os.environ["DATABASE_URL"] = url
    # ...each process with its own login (the portal's is yoco_web).
    os.environ["YOCO_PORTAL_DATABASE_URL"] = ctx.database.portal_url
    os.environ["YOCO_OWNER_DATABASE_URL"] = ctx.database.owner_url
    os.environ["YOCO_SINK_DATABASE_URL"] = ctx.database.sink_url
    os.environ["YOCO_DATA_DIR"] = str(ctx.settings.data_dir)
    if not os.environ.get("YOCO_WEB_SECRET_KEY"):
        from web.settings import WebSettings, resolve_secret

        resolve_secret(WebSettings(), ctx.settings.data_dir)  # created once, here
    from yoco.webapp import serve_workers

    serve_workers(workers, options)  # each worker with its own socket: balanced


def _stoppable_server(config: Any, stop: threading.Event) -> Any:
    """A ``uvicorn.Server`` for ``config`` that also shuts down gracefully once ``stop``
    is set (checked at each of its ticks, every 0.1 s): a SIGTERM noted before uvicorn's
    own handler was in place (see :func:`_sigterm_handler`)."""
    import uvicorn

    class _StoppableServer(uvicorn.Server):
        async def on_tick(self, counter: int) -> bool:
            if stop.is_set():
                self.should_exit = True
            return await super().on_tick(counter)

    return _StoppableServer(config)


def _password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if not sys.stdin.isatty():
        fail("no terminal to ask the password on: pipe it in with --password-stdin")
    value: str = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    return value


@users_app.command("add")
def users_add(
    email: Annotated[str, typer.Option(help="E-mail address (the login).")],
    role: Annotated[str, typer.Option(help="customer, operator or finance.")] = "customer",
    customer: Annotated[
        str | None, typer.Option(help="The customer (as on its contracts); customer users only.")
    ] = None,
    name: Annotated[str, typer.Option(help="Display name.")] = "",
    customer_admin: Annotated[
        bool,
        typer.Option("--customer-admin", help="A customer user who manages their customer's "
                     "API tokens in the portal (/account/tokens)."),
    ] = False,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the password from standard input.")
    ] = False,
) -> None:
    """Create a portal user; the password is asked for (or read from stdin), stored as argon2id."""
    from web.accounts import add_user, check_user_fields, customer_exists
    from web.errors import WebError
    from web.security import password_hasher
    from yoco.database import unit_of_work

    try:  # every flag is checked before the password is asked for
        check_user_fields(email=email, role=role, customer=customer)
    except WebError as exc:
        fail(exc.message)
    if customer_admin and role != "customer":
        fail("--customer-admin: only a customer user can be their customer's admin")
    password = _password(password_stdin)
    with application() as ctx:
        try:
            with unit_of_work(ctx.engine) as s:
                user = add_user(s, password_hasher(), email=email, name=name or email,
                                role=role, password=password, customer=customer,
                                customer_admin=customer_admin)
                known = customer is None or customer_exists(s, customer)
        except WebError as exc:
            fail(exc.message)
    out.print(f"created {user.role} user {user.email}"
              + (f" of customer {user.customer!r}" if user.customer else "")
              + (" (manages its API tokens)" if user.customer_admin else ""), highlight=False)
    if not known:
        err.print(f"note: no contract belongs to customer {customer!r} yet", highlight=False)


@users_app.command("list")
def users_list() -> None:
    """List portal users."""
    from sqlalchemy import select

    from web.models import PortalUser
    from yoco.database import unit_of_work

    with application() as ctx, unit_of_work(ctx.engine) as s:
        for u in s.execute(select(PortalUser).order_by(PortalUser.email)).scalars():
            state = " (disabled)" if u.disabled else ""
            out.print(f"{u.email}\t{u.role}\t{u.customer or '-'}{state}", highlight=False)


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Option(help="What the token is for, e.g. runtime-eu-1.")],
    contract: Annotated[
        list[str] | None,
        typer.Option("--contract", help="A contract it may post records for (repeat)."),
    ] = None,
    customer: Annotated[
        str | None, typer.Option(help="A customer whose data it may read through the API.")
    ] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option("--scope", help="An extra scope: 'metrics' (scrape /metrics: only "
                     "the --customer's or the --contract's contracts when given, else every "
                     "contract; repeat)."),
    ] = None,
) -> None:
    """Create an API token and print it ONCE (only its SHA-256 is stored)."""
    from web.accounts import create_token
    from web.errors import WebError
    from yoco.database import unit_of_work

    with application() as ctx:
        try:
            with unit_of_work(ctx.engine) as s:
                made = create_token(
                    s, name=name, contract_ids=contract, customer=customer, scopes=scope
                )
                prefix = made.row.prefix
        except WebError as exc:
            fail(exc.message)
    what = []
    if contract:
        what.append("post records for " + ", ".join(sorted(set(contract))))
    if customer:
        what.append(f"read the data of customer {customer!r}")
    if scope and "metrics" in scope:
        # A scope never widens the token's tenant (web.routers.metrics.scrape_scope).
        if customer:
            what.append(f"scrape /metrics for customer {customer!r}'s contracts only")
        elif contract:
            what.append("scrape /metrics for those contracts only")
        else:
            what.append("scrape /metrics for every contract (the vendor's monitoring)")
    err.print(f"token {prefix} ({name}) may " + " and ".join(what) + ".", highlight=False)
    err.print("It is shown once, now; store it as a secret:", highlight=False)
    print(made.text)


@tokens_app.command("revoke")
def tokens_revoke(
    prefix: Annotated[str, typer.Argument(help="The token's prefix, yoco_xxxxxxxx.")],
) -> None:
    """Revoke a token (it stops working at once)."""
    from web.accounts import revoke_token
    from yoco.database import unit_of_work

    with application() as ctx, unit_of_work(ctx.engine) as s:
        if not revoke_token(s, prefix):
            fail(f"no live token has prefix {prefix!r}")
    out.print(f"revoked {prefix}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``users`` and ``tokens`` to the ``yoco`` command."""
    app.command("serve")(serve)
    app.add_typer(users_app, name="users")
    app.add_typer(tokens_app, name="tokens")
