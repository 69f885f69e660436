"""The product's own scheduler: closes ended contract years, issues ended months'
reports and signs checkpoints in the background.

``yoco serve`` starts one :class:`CloseDueScheduler` (a daemon thread of the serving
process, not of each uvicorn worker) that runs :func:`billing.schedule.close_due_run`
at start-up and then every ``every`` seconds, so credits are issued without anyone
asking; then the monthly reports that are due (:func:`reports.issued.issue_due`: every
contract's month once it ended, issued once, over a checkpoint signed after it); then
the alerts' run (:func:`yoco.alerting.run_alerts`: detect, then deliver). Runs from
several places at once are safe (see :mod:`billing.schedule`, :mod:`alerts.detect`;
a month is issued once: the contract's log is locked and the issued document's key is
unique).

It also starts one :class:`CheckpointScheduler` (a second daemon thread) that signs every
log with new entries every ``checkpoint_every_s`` seconds
(:func:`billing.schedule.checkpoint_run`, under its own lock), so an entry has
an inclusion proof within that interval; the deploy/ timers run ``yoco ledger checkpoint``
on the same period where no ``yoco serve`` runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from billing.schedule import CheckpointRun, DueRun, checkpoint_run, close_due_run
from yoco.app import App

if TYPE_CHECKING:
    from collections.abc import Iterable

    from billing.witness_policy import PolicyReach
    from ledger.witnessing import SubmitRun
    from reports.issued import DueIssueRun
    from yoco.alerting import AlertsRun

log = logging.getLogger("yoco.scheduler")

#: After a checkpoint run that found another one at work, the next try comes this soon.
RETRY_S = 5.0


class CloseDueScheduler:
    """Run the close-due scheduler every ``every`` seconds in a daemon thread."""

    def __init__(
        self, ctx: App, every: float, clock: Callable[[], datetime] | None = None
    ) -> None:
        if not every > 0:
            raise ValueError("every: the scheduler's period must be positive (seconds)")
        self.ctx = ctx
        self.every = every
        #: The time the reports' run judges months by (injected in tests).
        self.clock = clock or (lambda: datetime.now(UTC))
        self.runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> DueRun:
        """One run, committed (or a no-op when another run holds the lock)."""
        from yoco.database import unit_of_work

        with unit_of_work(self.ctx.engine) as s:
            run = close_due_run(
                s, signer=self.ctx.signer, origin_prefix=self.ctx.settings.log_origin
            )
        self.runs += 1
        if not run.ran:
            log.info("close-due: another run holds the lock; nothing done")
        for r in run.results:
            credit = r.credit or {}
            log.warning(
                "close-due: %s year %d %s (guarantee %s)%s", r.contract_id, r.year, r.action,
                "met" if r.guarantee_met else "missed",
                f"; credit {credit.get('credit_note')} of {credit.get('amount')} "
                f"{credit.get('currency')} issued" if r.credit_issued else "",
            )
        return run

    def reports_once(self) -> DueIssueRun:
        """Issue the monthly reports that are due (each in its own transaction)."""
        from reports.issued import issue_due
        from yoco.database import unit_of_work

        run = issue_due(
            lambda: unit_of_work(self.ctx.engine),
            now=self.clock(),
            signer=self.ctx.signer,
            origin_prefix=self.ctx.settings.log_origin,
        )
        for r in run.results:
            if r.issued is not None and r.issued.created:
                log.warning("reports: %s %s issued over checkpoint %d (ledger entry %d)",
                            r.contract_id, r.month, r.issued.checkpoint_size, r.issued.seq)
            elif r.problem:
                log.warning("reports: %s %s not issued yet: %s", r.contract_id, r.month,
                            r.problem)
        return run

    def alerts_once(self) -> AlertsRun:
        """The alerts' run that follows each close-due run: detect, then deliver."""
        from yoco.alerting import alerts_config, run_alerts

        run = run_alerts(self.ctx.engine, alerts_config(self.ctx.settings))
        if run.sent or (run.detect is not None and run.detect.raised):
            log.warning("%s", run.summary())
        return run

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a database outage must not end the scheduler
                log.exception("close-due run failed; retrying in %.0f s", self.every)
            try:
                self.reports_once()
            except Exception:  # nor a report that cannot be rendered
                log.exception("reports run failed; retrying in %.0f s", self.every)
            try:
                self.alerts_once()
            except Exception:  # nor a broken alert destination
                log.exception("alerts run failed; retrying in %.0f s", self.every)
            self._stop.wait(self.every)

    def start(self) -> None:
        """Start the thread (the first run happens at once)."""
        if self._thread is not None:
            raise RuntimeError("the scheduler was started twice")
        self._thread = threading.Thread(target=self._loop, name="yoco-close-due", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to stop and wait for a run in progress to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def submit_and_alert(ctx: App) -> SubmitRun:
    """Submit every head a configured witness has not cosigned yet, store the
    cosignatures, raise an alert for each witness down or refusing, and publish each
    contract head that reached the quorum (``checkpoint_cosigned``, opt-in); committed."""
    from alerts.witnesses import raise_witness_alerts
    from ledger.witnessing import HttpTransport, submit_pending
    from yoco.database import unit_of_work

    transport = HttpTransport(ctx.settings.witness_timeout_s)
    try:
        run = submit_pending(ctx.engine, ctx.witnesses, transport)
    finally:
        transport.close()
    if run.down or run.refused or run.cosigned:
        with unit_of_work(ctx.engine) as s:
            raise_witness_alerts(s, run, witnesses=ctx.witnesses, quorum=ctx.witness_quorum)
    if run.down or run.refused:
        log.warning("%s", run.summary())
    return run


def check_witness_policies(
    ctx: App, contract_ids: Iterable[str] | None = None
) -> list[PolicyReach]:
    """The contracts (all, or ``contract_ids``) whose witness policy in force names a
    witness not in ``YOCO_WITNESSES`` (:func:`billing.witness_policy.unreached_policies`);
    raise ``witness_policy_unmet`` for each whose quorum the configured witnesses cannot
    reach; committed. The callers print or log :meth:`PolicyReach.words` of each."""
    from alerts.witnesses import raise_policy_alerts
    from billing.witness_policy import unreached_policies
    from yoco.database import unit_of_work

    configured = [w.key for w in ctx.witnesses]
    with unit_of_work(ctx.engine) as s:
        reaches = unreached_policies(s, configured, contract_ids)
        raise_policy_alerts(s, reaches)
    return reaches


class CheckpointScheduler:
    """Sign every log with new entries every ``every`` seconds, in a daemon thread.

    ``clock`` is a monotonic clock (seconds; tests inject one): :meth:`tick` runs when
    ``every`` seconds have passed since the last run started, so a run that takes long
    does not push the next one later than the interval promises.
    """

    def __init__(
        self, ctx: App, every: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not every > 0:
            raise ValueError("every: the checkpoint interval must be positive (seconds)")
        self.ctx = ctx
        self.every = every
        self.clock = clock
        self.runs = 0
        self.next_at: float | None = None  # None: due now
        self._policy_warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        """Whether a run is due at the clock's current time."""
        return self.next_at is None or self.clock() >= self.next_at

    def run_once(self) -> CheckpointRun:
        """One run, committed: sign every log that grew, then submit every head a
        witness has not cosigned yet (:meth:`witness_once`)."""
        from yoco.database import unit_of_work

        with unit_of_work(self.ctx.engine) as s:
            run = checkpoint_run(
                s, signer=self.ctx.signer, origin_prefix=self.ctx.settings.log_origin
            )
        self.runs += 1
        if run.heads:
            log.info("checkpoints: signed %d log(s)", len(run.heads))
        for exc in run.refused:  # one inconsistent log never stops the others' checkpoints
            log.error("checkpoint NOT SIGNED: %s", exc)
        try:
            for reach in check_witness_policies(self.ctx):
                words = reach.words()
                if words not in self._policy_warned:  # logged once, not every run
                    self._policy_warned.add(words)
                    log.warning("witness policy: %s", words)
        except Exception:  # a policy check never stops the checkpoints
            log.exception("witness policy check failed; retrying next run")
        if self.ctx.witnesses:
            try:
                self.witness_once()
            except Exception:  # the witnesses delay cosigning, never the checkpoints
                log.exception("witness submission failed; retrying next run")
        return run

    def witness_once(self) -> SubmitRun:
        """Submit to the witnesses; raise ``witness_down`` / ``witness_refused`` alerts."""
        return submit_and_alert(self.ctx)

    def tick(self) -> CheckpointRun | None:
        """Run if due (the next run is then due ``every`` seconds after this one
        started); return the run, or None when not due."""
        if not self.due():
            return None
        started = self.clock()
        self.next_at = started + self.every
        run = self.run_once()
        if not run.ran:  # another run was signing: look again soon, not a whole interval on
            self.next_at = started + min(self.every, RETRY_S)
        return run

    def _wait_s(self) -> float:
        if self.next_at is None:
            return 0.0
        return max(0.0, self.next_at - self.clock())

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a database outage must not end the scheduler
                log.exception("checkpoint run failed; retrying in %.0f s", self.every)
            self._stop.wait(self._wait_s())

    def start(self) -> None:
        """Start the thread (the first run happens at once)."""
        if self._thread is not None:
            raise RuntimeError("the checkpoint scheduler is started already")
        self._thread = threading.Thread(target=self._loop, name="yoco-checkpoints", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to stop and wait for a run in progress to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
