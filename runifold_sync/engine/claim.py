"""One claim of a task, as the parts of its run share it.

The step thread runs the workflow's code; the worker's heartbeat thread keeps the lease
and hears of cancel and pause requests. A ``Claim`` is the one object both hold: the
claimed task and its lease, the limits of this claim, and the flags the heartbeat thread
sets and the step thread reads at every step boundary.
"""

from __future__ import annotations

import time

import attrs

from ..errors import LeaseLostError
from ..model.checkpoint import DEFAULT_MAX_ENTRY_BYTES
from ..store.records import ClaimedTask, Lease
from .deadlines import RunningBodies
from .interrupts import Unwind
from .spans import NO_SPANS, ClaimSpans


@attrs.define(eq=False)
class Claim:
    """A claimed task while it runs here: what every part of its run reads (the lease,
    the claim's limits, its cycle span) and what the heartbeat thread tells the step
    thread about the lease it watches (``LeaseKeeper.watch`` sets the deadline).

    The flags are plain attributes, not ``threading.Event``: only the heartbeat thread
    (or a commit's answer) sets them and the step thread reads them at its boundaries,
    and nobody waits on them; a new pair of events (each with its own condition and
    lock) for every task was a measurable share of a one-step task's CPU."""

    claimed: ClaimedTask
    lease: Lease = attrs.field(  # the claimed task's, which every fenced write carries
        init=False, default=attrs.Factory(lambda self: self.claimed.lease, takes_self=True)
    )
    max_steps_per_claim: int | None = None  # bodies run before the task is handed back
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    spans: ClaimSpans = NO_SPANS  # the claim's bodies and waits report to its cycle span
    bodies: RunningBodies = attrs.Factory(RunningBodies)  # those with a timeout, running now
    # Monotonic time by which the lease surely expired unless a heartbeat extended it.
    deadline: float = float("inf")
    # Store time minus monotonic time, from the lease's expiry: store time read without a
    # round trip (``store_now``), for the deadlines a claim records.
    store_offset_s: float = 0.0
    lost: bool = False
    cancel: bool = False  # store.cancel() was called (also set by a checkpoint commit)
    # The cancel reached the main function (``CancelRequested`` raised at a boundary):
    # from then on its ``finally:`` blocks may run steps, as they do on a failure.
    cancel_delivered: bool = False
    pause: bool = False  # store.pause() was called (also set by a checkpoint commit)
    # Why the worker hands the task back at its next step boundary (it must stop soon).
    hand_back: str | None = None

    def expired(self) -> bool:
        """Lost, or past the deadline: a resumed (SIGCONT) or starved process must not
        start a body before its heartbeat thread has even run again."""
        return self.lost or time.monotonic() >= self.deadline

    def check_lease(self) -> None:
        """Unwind the run when the lease is gone: nothing new may start under it."""
        if self.lost or time.monotonic() >= self.deadline:
            raise Unwind(LeaseLostError(self.lease.task_id, self.lease.fencing_token, "next step"))

    def store_now(self) -> float:
        """Store time now, in epoch seconds, as the lease's expiry tells it (off by at most
        the latency of the write that set it)."""
        return time.monotonic() + self.store_offset_s
