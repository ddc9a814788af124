"""``CycleObserver``: what a worker tells instrumentation about its cycles, its heartbeats
and its store.

The worker knows nothing of any metrics library: it calls an observer, if it was given
one, when it claims a task and when the cycle ends, and its heartbeat thread and store
report their timings to the same observer. Without an observer none of this does extra
work, not even a clock read, so the library costs nothing when metrics are off.

The timings are the four readings a rise in lease losses calls for (seed 000: lower
concurrency, then look at database pool waits, transaction latency, heartbeat timing
and runtime stalls).
"""

from __future__ import annotations

from ..model.outcomes import RunOutcome
from ..store.records import ClaimedTask


class CycleObserver:
    """Hears about each cycle that claimed a task (idle polls are not cycles here), each
    heartbeat and each store operation of the worker. Subclasses override what they
    record; these do nothing. Called on the worker's threads, so they must be quick and
    must not raise."""

    def claimed(self, claimed: ClaimedTask) -> None:
        """A task was just leased; ``claimed`` says how long it waited and how it was
        resumed (queue delay, wait kind and start)."""

    def finished(self, claimed: ClaimedTask, outcome: RunOutcome, duration_s: float) -> None:
        """The cycle of ``claimed`` ended in ``outcome`` after ``duration_s`` seconds
        (monotonic, from the claim to the store transition)."""

    def store_operation(self, operation: str, duration_s: float) -> None:
        """A store operation of the worker (``claim``, ``heartbeat``, ``complete``...)
        took ``duration_s`` seconds, its round trips and transaction included."""

    def pool_wait(self, requests: int, waited: int, wait_s: float) -> None:
        """Since the last report, ``requests`` store requests, ``waited`` of which waited
        for a connection (PostgreSQL's pool) or for the database lock (SQLite), for
        ``wait_s`` seconds in all."""

    def heartbeat(self, lateness_s: float, lease_left_s: float) -> None:
        """A heartbeat of the running task's lease landed ``lateness_s`` seconds after its
        schedule, with ``lease_left_s`` seconds of the lease left (as this worker counts
        them) when the store answered."""

    def runtime_stall(self, drift_s: float) -> None:
        """The heartbeat thread woke ``drift_s`` seconds after it asked to: the process
        was frozen (SIGSTOP, a paused VM) or starved (a step holding the GIL)."""
