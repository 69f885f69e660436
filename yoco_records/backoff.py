"""The one retry-backoff rule of the product (pure: no clock, no randomness of its own).

Both the runtime's outbox (records to the ledger, :mod:`runtime.outbox`) and the
operators' alerts (webhooks and mail, :mod:`alerts.config`) wait between failed
deliveries by this rule. It lives here, with the records' other shared rules, because
the runtime may import nothing of the server's packages and the alerts nothing of the
runtime: :mod:`yoco_records` is the one package both may import.

The rule ("equal jitter"): after the ``n``-th consecutive failure (``n`` from 1) the
full wait is ``base_s × 2^(n−1)``, at most ``cap_s``; the caller waits its first half
always and a ``jitter`` share (from 0 to 1, drawn by the caller) of its second half. So
a wait never falls below half the full one (a dead destination is not hammered) and many
clients failing together spread their retries over that second half instead of retrying
in lock-step. ``jitter=1`` gives the full wait, deterministically.
"""

from __future__ import annotations

__all__ = ["MAX_DOUBLINGS", "backoff_s"]

#: Doublings counted at most: past them the cap has long been reached for any sane
#: ``base_s``/``cap_s``, and ``2**n`` of an outage's thousandth failure would overflow a
#: float.
MAX_DOUBLINGS = 64


def backoff_s(failed: int, *, base_s: float, cap_s: float, jitter: float = 1.0) -> float:
    """Seconds to wait after the ``failed``-th consecutive failed attempt (from 1), by the
    module's rule: ``min(cap_s, base_s × 2^(failed−1))``, its first half plus ``jitter``
    (0 to 1) times its second half. Raises ValueError, naming the argument, for a
    ``failed`` below 1, a ``jitter`` outside [0, 1], or not ``0 < base_s <= cap_s``."""
    if isinstance(failed, bool) or not isinstance(failed, int) or failed < 1:
        raise ValueError(f"failed: counts failed attempts from 1, got {failed!r}")
    if not 0 <= jitter <= 1:
        raise ValueError(f"jitter: expected 0 <= jitter <= 1, got {jitter!r}")
    if not 0 < base_s <= cap_s:
        raise ValueError(f"base_s, cap_s: need 0 < base_s <= cap_s, got {base_s!r}, {cap_s!r}")
    full = min(cap_s, base_s * 2.0 ** min(failed - 1, MAX_DOUBLINGS))
    return full / 2 + full / 2 * jitter
