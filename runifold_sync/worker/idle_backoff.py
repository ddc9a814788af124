"""How a worker loop waits when a claim found nothing: in the store's ``wait_for_work``
(woken by NOTIFY on PostgreSQL) for up to a jittered, growing backoff, in slices short
enough that a stop request is seen promptly."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from ..model import validate

if TYPE_CHECKING:
    from ..model.cancellation import CancellationToken
    from ..store.base import WorkflowStore
    from ..store.records import Routes

DEFAULT_MIN_BACKOFF = timedelta(milliseconds=25)
DEFAULT_MAX_BACKOFF = timedelta(seconds=5)
# Longest single wait_for_work call of an idle worker: the bound on how late it sees a stop.
IDLE_WAIT_SLICE_S = 0.5


def check_backoff_bounds(minimum: object, maximum: object) -> tuple[timedelta, timedelta]:
    """Both bounds positive timedeltas, the minimum not above the maximum."""
    low = validate.positive_duration("minimum backoff", minimum)
    high = validate.positive_duration("maximum backoff", maximum)
    if low > high:
        raise InvalidArgument(f"minimum backoff {low} is above maximum backoff {high}")
    return low, high


class IdleBackoff:
    """Exponential idle delay between min and max, jittered over the upper half of each
    step so idle workers do not poll the store in lockstep. The first step spans
    [min, 2 * min] (capped at max): starting at exactly min would put workers that went
    idle together back in step on their first wait."""

    def __init__(self, minimum: timedelta, maximum: timedelta) -> None:
        low, high = check_backoff_bounds(minimum, maximum)
        self._min_s = low.total_seconds()
        self._max_s = high.total_seconds()
        self._first_s = min(2 * self._min_s, self._max_s)
        self._current_s = self._first_s

    def reset(self) -> None:
        self._current_s = self._first_s

    def next_s(self) -> float:
        delay = random.uniform(max(self._min_s, self._current_s / 2), self._current_s)
        self._current_s = min(self._current_s * 2, self._max_s)
        return delay


class IdleWait:
    """What a worker loop does after a claim came back empty, and after work (``worked``,
    which starts the backoff again from its first step)."""

    def __init__(
        self, store: WorkflowStore, backoff: IdleBackoff, routes: Callable[[], Routes | None] = lambda: None
    ) -> None:
        self._store = store
        self._backoff = backoff
        self._routes = routes  # only work these routes can claim wakes the worker
        # The last empty claim found work due that it could not take.
        self._due_but_unclaimable = False

    def worked(self) -> None:
        self._backoff.reset()

    def wait(self, token: CancellationToken) -> None:
        """Wait for work after an empty claim, or until ``token`` is cancelled.

        Work due right after an empty claim either just arrived (claim again at once) or
        is work this worker may not take: held by tenant admission, or rows other
        claimers hold. Twice in a row means the latter: sleep the backoff out rather than
        ask the store again at once."""
        due_now = self._store.wait_for_work(timedelta(0), self._routes())
        if due_now and self._due_but_unclaimable:
            token.wait(self._backoff.next_s())
            self._due_but_unclaimable = False
        else:
            self._due_but_unclaimable = due_now
            if not due_now:
                self._wait_for_work(self._backoff.next_s(), token)

    def _wait_for_work(self, delay_s: float, token: CancellationToken) -> None:
        """Idle for up to ``delay_s``, returning early when the store says work is claimable
        (PostgreSQL: a NOTIFY or a due time; SQLite: its poll) or the token is cancelled.

        A signal cannot interrupt a blocking ``wait_for_work`` (the handler only cancels
        the token and the wait resumes), so the wait runs in slices of at most
        ``IDLE_WAIT_SLICE_S`` with the token checked between them: SIGTERM stops an idle
        worker within one slice rather than after up to the maximum backoff. Work that
        arrives between two slices is not missed: each slice looks for due work before it
        sleeps.
        """
        deadline = time.monotonic() + delay_s
        while not token.cancelled:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return
            if self._store.wait_for_work(
                timedelta(seconds=min(remaining_s, IDLE_WAIT_SLICE_S)), self._routes()
            ):
                return
