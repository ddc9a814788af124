"""Store time as a test moves it: forward only, relative to wherever it stands.

Timers, waits' timeouts, retry backoffs and leases follow store time, never the test
process's clock, so a test skips a day by moving the store's shared clock offset. That
offset is absolute (``store.set_clock_offset``), and ``run_until_idle`` moves it too, so
every move here starts from the offset the store holds now (``store.clock_reading``)
rather than from a total kept in the test: a test that advances the clock itself and
lets ``run_until_idle`` skip to the next timer gets both moves.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..errors import InvalidArgument
from ..model import validate
from ..store.base import WorkflowStore


class StoreClock:
    """The shared clock of ``store``'s database, as a test reads and moves it."""

    def __init__(self, store: WorkflowStore) -> None:
        if not isinstance(store, WorkflowStore):
            raise InvalidArgument(
                f"store must be a WorkflowStore, got a {type(store).__name__}"
                + ("; a store URL is opened with open_store(url)" if isinstance(store, str) else "")
            )
        self.store = store

    def now(self) -> datetime:
        """Store time: what decides whether a timer is due."""
        return self.store.now()

    def advance(self, delta: timedelta) -> datetime:
        """Move store time forward by ``delta`` (a positive ``timedelta``); returns the
        new store time. Store time never runs backwards, so a negative step is refused."""
        validate.positive_duration("advance delta", delta)
        reading = self.store.clock_reading()
        self.store.set_clock_offset(reading.offset + delta)
        return reading.now + delta

    def advance_to(self, when: datetime) -> datetime:
        """Move store time forward to ``when`` (an aware datetime), or leave it where it
        is if it is there already; returns store time then."""
        if not isinstance(when, datetime) or when.utcoffset() is None:
            raise InvalidArgument(f"advance_to takes an aware datetime, got {validate.shown(when)}")
        reading = self.store.clock_reading()
        if when <= reading.now:
            return reading.now
        self.store.set_clock_offset(reading.offset + (when - reading.now))
        return when

    def next_due(self) -> datetime | None:
        """When the next task that no worker holds and nobody paused becomes claimable
        (a timer, a wait's timeout, a retry's backoff), None when no such task has a due
        time: what ``run_until_idle`` skips to."""
        return self.store.clock_reading().next_due
