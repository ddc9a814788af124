"""``CycleObserver``: what a worker tells instrumentation about its cycles.

The worker knows nothing of any metrics library: it calls an observer, if it was given
one, when it claims a task and when the cycle ends. Without an observer a cycle does no
extra work, not even a clock read, so the library costs nothing when metrics are off.
"""

from __future__ import annotations

from .outcomes import RunOutcome
from .store.records import ClaimedTask


class CycleObserver:
    """Hears about each cycle that claimed a task (idle polls are not cycles here).
    Subclasses override what they record; these do nothing. Called on the worker's
    thread, so they must be quick and must not raise."""

    def claimed(self, claimed: ClaimedTask) -> None:
        """A task was just leased; ``claimed`` says how long it waited and how it was
        resumed (queue delay, wait kind and start)."""

    def finished(self, claimed: ClaimedTask, outcome: RunOutcome, duration_s: float) -> None:
        """The cycle of ``claimed`` ended in ``outcome`` after ``duration_s`` seconds
        (monotonic, from the claim to the store transition)."""
