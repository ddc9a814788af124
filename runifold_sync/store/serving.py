"""Read-only views an operator needs, computed from the store: which referenced
definition versions live workers serve, which queued work no live worker can claim
(its queue, version or steps), and which stored schedules no live worker declares. The
CLI, ``stats`` and the metrics exporter share them so every surface answers the same
question the same way."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import attrs

from .base import WorkflowStore
from .records import RoutedBacklog, VersionReference, WorkerRecord, unserved_reason
from .schedule_records import ScheduleRecord

DEFAULT_LIVE_WITHIN = timedelta(seconds=60)


@attrs.frozen
class ServedVersion:
    """A referenced definition version and how many live workers serve it; zero means
    its tasks cannot run until a worker registering it starts."""

    reference: VersionReference
    live_workers: int


def served_versions(
    store: WorkflowStore, live_within: timedelta = DEFAULT_LIVE_WITHIN
) -> list[ServedVersion]:
    references = store.referenced_versions()
    live = [w for w in store.workers() if w.live(live_within)]
    return [ServedVersion(r, sum((r.name, r.version) in w.definitions for w in live)) for r in references]


@attrs.frozen
class UnservedWork:
    """Unfinished tasks of one queue and definition version that no live worker can
    claim, and why (``reason``: "no live worker serves queue 'render'", ...)."""

    backlog: RoutedBacklog
    reason: str


def unserved_work(store: WorkflowStore, live_within: timedelta = DEFAULT_LIVE_WITHIN) -> list[UnservedWork]:
    live = [w for w in store.workers() if w.live(live_within)]
    found = []
    for backlog in store.routed_backlog():
        reason = unserved_reason(backlog.queue, backlog.name, backlog.version, backlog.fingerprint, live)
        if reason is not None:
            found.append(UnservedWork(backlog, reason))
    return found


def unserved_ready(store: WorkflowStore, live_within: timedelta = DEFAULT_LIVE_WITHIN) -> list[UnservedWork]:
    """The part of :func:`unserved_work` that is ready now (queued, due, not paused): the
    tasks that would run at once if a worker could claim them."""
    return [work for work in unserved_work(store, live_within) if work.backlog.ready]


@attrs.frozen
class ReadyRoute:
    """Ready tasks (queued, due, not paused) of one queue and definition version, and how
    many of them no live worker can claim (its queue, version or steps)."""

    queue: str
    name: str
    version: int
    ready: int
    unserved: int


def ready_routes(store: WorkflowStore, live_within: timedelta = DEFAULT_LIVE_WITHIN) -> list[ReadyRoute]:
    """Every queue and definition version with ready tasks, from one backlog read: a
    route whose tasks a live worker serves has ``unserved`` 0, so a gauge of it drops
    to 0 when such a worker registers rather than keeping its last value."""
    live = live_workers(store, live_within)
    totals: dict[tuple[str, str, int], tuple[int, int]] = {}
    for b in store.routed_backlog():
        if not b.ready:
            continue
        blocked = unserved_reason(b.queue, b.name, b.version, b.fingerprint, live) is not None
        ready, unserved = totals.get((b.queue, b.name, b.version), (0, 0))
        totals[(b.queue, b.name, b.version)] = (ready + b.ready, unserved + (b.ready if blocked else 0))
    return [ReadyRoute(q, n, v, ready, unserved) for (q, n, v), (ready, unserved) in sorted(totals.items())]


def no_live_worker_declares(schedule: ScheduleRecord, live: Sequence[WorkerRecord]) -> bool:
    """Whether it is certain that none of the ``live`` workers declares ``schedule``.

    A worker declares its registry's schedules once it has registered, and each
    declaration moves ``declared_at`` to then; a registry that adds a schedule serves its
    workflow version. So a live worker that declares it started at or before its last
    declaration and serves that version; when none does (or none is live), the schedule
    is stored but no running registry has it. False is not proof of the opposite: a live
    worker that started earlier and serves the version may have it or not. A schedule
    created at run time (``store.create_schedule``) is ticked by every live worker that
    serves its version, whenever it started."""
    if schedule.origin == "created":
        return not any((schedule.workflow, schedule.version) in w.definitions for w in live)
    return not any(
        w.started_at <= schedule.declared_at and (schedule.workflow, schedule.version) in w.definitions
        for w in live
    )


def live_workers(store: WorkflowStore, live_within: timedelta = DEFAULT_LIVE_WITHIN) -> list[WorkerRecord]:
    return [w for w in store.workers() if w.live(live_within)]
