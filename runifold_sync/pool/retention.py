"""Pruning beside running work, at a low rate: what ``run --retention 30d`` does.

:meth:`WorkflowStore.prune` deletes in short batches, but run flat out it still takes a
database connection's whole time. :func:`keep_pruning` paces it: after each batch it
rests so that pruning takes at most ``RetentionPolicy.share`` of the time (a batch of
40 ms, then 360 ms of rest at the default 10%), and once nothing old is left it looks
again every ``RetentionPolicy.every`` (a minute for a retention of ten minutes or more).
So a backlog of old tasks (the first run on a database kept for years) drains at a
tenth of the store's delete speed, and a steady stream of finished tasks is deleted
about as fast as they age, with the pool's own work first. A store outage is said once
in the log (the store's ``OutageLog``) and waited out.

Where it runs: ``retention_process`` starts it in a process of its own beside a pool
(the supervisor's process holds no connection, see ``supervisor``); an application can
also call it from a thread of its own with a store of that thread's process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import attrs

from ..model import validate
from ..model.cancellation import CancellationToken
from ..store import checks
from ..store.base import WorkflowStore

log = logging.getLogger("runifold_sync.pool.retention")


def _share(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        validate.refuse(field, "a number in (0, 1]", value)
    return value


def _default_every(policy: RetentionPolicy) -> timedelta:
    """A tenth of the retention, from a second to a minute: a task is pruned within
    about a tenth of the retention after it aged, without a 30-day retention looking
    more often than once a minute."""
    if not isinstance(policy.older_than, timedelta):
        return timedelta(minutes=1)  # attrs validates after defaults: older_than's check refuses it
    return min(timedelta(minutes=1), max(policy.older_than / 10, timedelta(seconds=1)))


@attrs.frozen
class RetentionPolicy:
    """Prune finished tasks last changed more than ``older_than`` ago, ``batch`` tasks
    a transaction, spending at most ``share`` of the time on it, and look again every
    ``every`` (by default a tenth of ``older_than``, from 1 s to 1 min) once none are
    left. Tasks failed on an unresolved ambiguous effect are always kept: deleting them
    is an operator's call (``prune --include-ambiguous``)."""

    older_than: timedelta = validate.field(validate.duration, name="retention")
    batch: int = validate.field(
        validate.bounded_by(validate.integer, minimum=1, maximum=checks.MAX_PRUNE_BATCH),
        500,
        name="retention batch",
    )
    share: float = validate.field(_share, 0.1, name="retention share")
    every: timedelta = validate.field(
        validate.positive_duration, attrs.Factory(_default_every, takes_self=True), name="retention interval"
    )


def keep_pruning(
    store: WorkflowStore,
    policy: RetentionPolicy,
    token: CancellationToken,
    *,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Prune by ``policy`` until ``token`` is cancelled; returns how many tasks were
    deleted. ``on_batch`` hears each batch's count. A stop waits for the batch in hand
    (one short transaction), never for the rest of a walk."""
    pruned = 0
    while not token.cancelled:
        try:
            walk = store.prune_batches(policy.older_than, batch=policy.batch)
            for deleted in paced(walk, policy.share, token):
                store.outage.answered()
                pruned += deleted
                if on_batch is not None:
                    on_batch(deleted)
        except Exception as exc:  # an outage, said once; anything else is logged whole
            store.outage.report(log, "pruning", exc, {})
        token.wait(policy.every.total_seconds())
    return pruned


def paced(batches: Iterator[int], share: float, token: CancellationToken) -> Iterator[int]:
    """``batches`` (a walk of :meth:`WorkflowStore.prune_batches`) with a rest after each
    batch, so that at most ``share`` of the time goes to them (1: no rest); it ends early
    when ``token`` is cancelled, leaving the rest of the walk for the next prune."""
    _share("retention share", share)
    rest_per_busy_s = (1 - share) / share
    while True:
        started = time.monotonic()
        deleted = next(batches, None)
        if deleted is None:
            return
        busy_s = time.monotonic() - started
        yield deleted
        if token.wait(busy_s * rest_per_busy_s):
            return
