"""Step and effect timeouts, as the running process watches them.

A sync body cannot be interrupted from inside, so a timeout is enforced from outside it:
while a body with a timeout runs, :class:`RunningBodies` knows its deadline (monotonic
time). The heartbeat thread asks it whether a body is past its deadline, and stops
extending the task's lease once one is, so another worker can take the task over one
lease later; a supervised pool's child tells its parent the earliest deadline (a line
on the report pipe it already writes), and the parent, which shares the host's
monotonic clock, kills the child stuck past it. Nothing here touches the store: what is
recorded durably, so that the next claim can count the attempt, is ``timeouts.py``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Hears the earliest monotonic deadline of the bodies running now (None when none is),
# each time it changes: how a pool's child tells its supervisor when to kill it.
DeadlineListener = Callable[[float | None], None]


def describe_timeout(seconds: float) -> str:
    """A timeout as failure reasons name it: ``1s``, ``0.25s``, ``90s``."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


class RunningBodies:
    """The bodies with a timeout that run now in this claim (several at once in parallel
    branches), by call id: their monotonic deadline and timeout. Written by the threads
    that run bodies, read by the heartbeat thread; the listener is told under the lock,
    so the deadlines it hears arrive in the order they changed."""

    def __init__(self, listener: DeadlineListener | None = None) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, float]] = {}  # call id -> (deadline, timeout_s)
        self._listener = listener

    def begin(self, call_id: str, timeout_s: float) -> None:
        """A body with a timeout of ``timeout_s`` starts now."""
        with self._lock:
            self._running[call_id] = (time.monotonic() + timeout_s, timeout_s)
            self._changed()

    def end(self, call_id: str) -> bool:
        """The body ``call_id`` ended (returned or raised); True when it ended past its
        deadline, which makes the attempt a timed-out one."""
        now = time.monotonic()
        with self._lock:
            deadline, _timeout_s = self._running.pop(call_id)
            self._changed()
        return now >= deadline

    def overdue(self) -> tuple[str, float] | None:
        """The call id and timeout of a body running past its deadline, None when none is."""
        now = time.monotonic()
        with self._lock:
            for call_id, (deadline, timeout_s) in self._running.items():
                if now >= deadline:
                    return call_id, timeout_s
        return None

    def _changed(self) -> None:
        if self._listener is not None:
            self._listener(min((d for d, _t in self._running.values()), default=None))
