"""Read-only views an operator needs, computed from the store: which referenced
definition versions live workers serve, and which queued work no live worker can claim
(its queue, version or steps). The CLI, ``stats`` and the metrics exporter share
them so every surface answers the same question the same way."""

from __future__ import annotations

from datetime import timedelta

import attrs

from .store.base import WorkflowStore
from .store.records import RoutedBacklog, VersionReference, unserved_reason

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
