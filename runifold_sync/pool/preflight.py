"""What ``run`` checks before it forks a pool: that the store answers and its schema is
this release's (opening it migrates a schema that is behind and refuses a newer one),
and that no worker elsewhere is live under one of the pool's ids (a pool's first child
checks its own id again, for a pool started from Python).

A pool whose store is down or misnamed otherwise forked children that died at once,
over and over; and two pools under one ``--worker-id`` overwrote each other's rows in
the worker registry, so ``workers`` showed a live worker as stopped and ``versions``
counted one live worker where two ran.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

from ..errors import WorkerIdInUse
from ..store.base import WorkflowStore
from ..store.open import open_store
from ..store.records import WorkerRecord

# A registered worker counts as live for this many heartbeat intervals since last seen.
_LIVE_BEATS = 3


def check_pool_can_start(url: str, worker_ids: Iterable[str], heartbeat: timedelta) -> None:
    """Raise what stops the pool before any child is forked: the store's own error
    (``StoreUnavailable``, ``SchemaTooNew``...) or :class:`WorkerIdInUse`. The store is
    closed again, its threads and connections with it, before the caller forks."""
    with open_store(url) as store:
        check_ids_free(store, worker_ids, heartbeat)


def check_ids_free(store: WorkflowStore, worker_ids: Iterable[str], heartbeat: timedelta) -> None:
    """Raise :class:`WorkerIdInUse` when a worker under one of ``worker_ids`` (or a later
    incarnation of one, ``<id>.<n>``) is live in another process: seen within three
    ``heartbeat`` intervals, not stopped, and not a process of this host that is gone."""
    wanted = set(worker_ids)
    window = heartbeat * _LIVE_BEATS
    others = [
        w
        for w in store.workers()
        if first_incarnation(w.worker_id) in wanted and w.live(window) and not _gone(w)
    ]
    if others:
        taken = ", ".join(
            f"{w.worker_id} (host {w.host}, pid {w.pid}, seen {w.silent_s:.0f} s ago)"
            for w in sorted(others, key=lambda w: w.worker_id)
        )
        raise WorkerIdInUse(
            f"worker id already live: {taken}; give this pool another --worker-id (ids must be "
            "unique per host and process), or stop that pool (its ids free up "
            f"{window.total_seconds():.0f} s after it was last seen)"
        )


def first_incarnation(worker_id: str) -> str:
    """The id a pool's slot started with: ``pool-0`` for ``pool-0`` and for the children
    started in its place after one died, ``pool-0.1``, ``pool-0.2``..."""
    first, dot, generation = worker_id.rpartition(".")
    return first if dot and generation.isdigit() else worker_id


def _gone(worker: WorkerRecord) -> bool:
    """A worker registered on this host whose process no longer runs (a pool killed
    without stopping its workers): its row is stale, whatever its last sighting."""
    if worker.host != socket.gethostname():
        return False
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user has that pid
        return False
    return _zombie(worker.pid)


def _zombie(pid: int) -> bool:
    """Killed and not yet reaped (Linux): it runs no more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False
