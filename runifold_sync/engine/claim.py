"""What a claim's run is told about its lease while it runs.

The step thread runs the workflow's code; the worker's heartbeat thread keeps the lease
and hears of cancel and pause requests. ``LeaseFlags`` is how the second tells the first,
read at every step boundary.
"""

from __future__ import annotations

import time

import attrs

from .deadlines import RunningBodies


@attrs.define
class LeaseFlags:
    """What the heartbeat thread tells the step thread about the lease it watches.

    Plain attributes, not ``threading.Event``: only the heartbeat thread sets them and
    the step thread reads them at its boundaries, and nobody waits on them; a new pair of
    events (each with its own condition and lock) for every task was a measurable share
    of a one-step task's CPU."""

    # Monotonic time by which the lease surely expired unless a heartbeat extended it.
    deadline: float
    lost: bool = False
    cancel: bool = False  # store.cancel() was called (also set by a checkpoint commit)
    # The cancel reached the main function (``CancelRequested`` raised at a boundary):
    # from then on its ``finally:`` blocks may run steps, as they do on a failure.
    cancel_delivered: bool = False
    pause: bool = False  # store.pause() was called (also set by a checkpoint commit)
    # Why the worker hands the task back at its next step boundary (it must stop soon).
    hand_back: str | None = None
    # Store time minus monotonic time, from the lease's expiry: store time read without a
    # round trip (``store_now``), for the deadlines a claim records.
    store_offset_s: float = 0.0
    bodies: RunningBodies = attrs.Factory(RunningBodies)  # those with a timeout, running now

    def expired(self) -> bool:
        """Lost, or past the deadline: a resumed (SIGCONT) or starved process must not
        start a body before its heartbeat thread has even run again."""
        return self.lost or time.monotonic() >= self.deadline

    def store_now(self) -> float:
        """Store time now, in epoch seconds, as the lease's expiry tells it (off by at most
        the latency of the write that set it)."""
        return time.monotonic() + self.store_offset_s
