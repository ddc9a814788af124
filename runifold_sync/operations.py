"""Read-only views an operator needs, computed from the store: which referenced
definition versions live workers serve. The CLI, ``stats`` and the metrics exporter share
them so every surface answers the same question the same way."""

from __future__ import annotations

from datetime import timedelta

import attrs

from .store.base import WorkflowStore
from .store.records import VersionReference

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
