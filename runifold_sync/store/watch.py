"""How a caller blocked in ``store.wait_for_task`` or ``store.get_event`` learns that the
task it waits on may have changed, so it reads the task again only then.

A backend hands out a :class:`Watch` for one task (``Dialect.watch``), subscribed before
the caller first reads the task: a change committed after that read wakes the watch, and
one committed before it is seen by the read itself, so none falls between the two.

- PostgreSQL: the transitions that end a task and ``ctx.set_event`` NOTIFY the task id,
  and one LISTEN connection per store wakes the watches of that task (``pglisten``).
- SQLite: :class:`CounterWatch` reads ``PRAGMA data_version``, a counter in shared
  memory that changes when another connection commits; the task is read again only
  when it moved.
- PostgreSQL behind a transaction pooler with no direct connection to LISTEN on:
  :class:`PollWatch`, every ``pgurl.POLL_INTERVAL_S``, as idle workers poll there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Watch(Protocol):
    """A subscription to one task's changes, open for one wait."""

    def wait(self, timeout_s: float) -> None:
        """Return once the task may have changed, or after ``timeout_s``; the caller
        reads it again either way (a wake-up means "look", never "it is done")."""


class CounterWatch:
    """Wakes when ``version`` (a database change counter) differs from its value when the
    watch was made or last woke, looking every ``poll_s``: a read of shared memory, not
    of the task."""

    def __init__(self, version: Callable[[], int], poll_s: float) -> None:
        self._version = version
        self._poll_s = poll_s
        self._seen = version()  # before the caller's first read of the task

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return
            time.sleep(min(remaining_s, self._poll_s))
            version = self._version()
            if version != self._seen:
                self._seen = version
                return


class PollWatch:
    """Wakes every ``interval_s``: for a store that can hear of no change."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s

    def wait(self, timeout_s: float) -> None:
        time.sleep(max(0.0, min(timeout_s, self._interval_s)))
