"""How long a store's operations take, and how long they waited for a connection, for
whoever watches the store (a worker's :class:`~runifold_sync.worker.observer.CycleObserver`).

A store operation decorated with :func:`timed` reports its duration to the store's
``operation_timer`` when one is set, and costs one attribute read when none is. The
waits are counted by the dialect (a pool checkout on PostgreSQL, the database lock on
SQLite) and taken with ``Dialect.pool_waits``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import attrs

F = TypeVar("F", bound=Callable[..., Any])
OperationTimer = Callable[[str, float], None]


def timed(method: F) -> F:
    """Report each call's duration under the method's name to ``self.operation_timer``
    (a store's, see :class:`~runifold_sync.store.base.WorkflowStore`)."""
    name = method.__name__

    @functools.wraps(method)
    def measured(self: Any, *args: Any, **kwargs: Any) -> Any:
        timer = self.operation_timer
        if timer is None:
            return method(self, *args, **kwargs)
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            timer(name, time.perf_counter() - started)

    return cast(F, measured)


@attrs.define
class PoolWaits:
    """Requests for a connection (or the database lock) since the last count, how many
    of them had to wait, and for how long in all."""

    requests: int = 0
    waited: int = 0
    wait_s: float = 0.0

    def add(self, wait_s: float) -> None:
        self.requests += 1
        if wait_s > 0:
            self.waited += 1
            self.wait_s += wait_s
