"""``CancellationToken``: the one stop flag shared by a worker loop, a supervisor and
their signal handlers.

A leaf module (it imports nothing from the package), so the worker and the supervisor
can both depend on it without depending on each other.

The flag takes no lock. A signal handler runs in the main thread between two bytecodes,
possibly while that same thread is inside ``wait``: had the flag been a
``threading.Event``, the handler's ``set()`` could block on the event's lock held by the
very thread it interrupted, and the process would never stop (a pool that ignored
SIGTERM now and then). So ``cancel`` is one attribute store, and ``wait`` sleeps in
short slices, looking at the flag between them.
"""

from __future__ import annotations

import time

# How soon a waiter notices a cancel: SIGTERM reaches an idle supervisor or worker within
# this, and the wakeups cost a few microseconds each.
WAKE_SLICE_S = 0.02


class CancellationToken:
    """A one-way stop flag that signal handlers and other threads may set."""

    def __init__(self) -> None:
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True as soon as (within ``WAKE_SLICE_S``) the token
        is cancelled."""
        deadline = time.monotonic() + timeout_s
        while not self._cancelled:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, WAKE_SLICE_S))
        return True
