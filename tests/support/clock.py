"""The store's shared clock, as tests move it."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import WorkflowStore


class Clock:
    """Moves store time forward for every connection to the database (the store's shared
    clock offset); offsets are absolute, so it keeps the running total.

    ``advance`` takes a ``timedelta`` or a number of seconds: the worker and signal unit
    tests count in seconds, the contract tests in timedeltas."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self.offset = timedelta(0)

    def advance(self, delta: timedelta | float) -> None:
        self.offset += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        self.store.set_clock_offset(self.offset)
