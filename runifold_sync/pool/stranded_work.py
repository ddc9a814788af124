"""Says in a pool's log when ready work waits that no live worker can claim.

Tasks of a definition version no live worker registers, of a queue none claims from, or
checkpointed by steps no live worker has (a deploy that changed a step under the same
version) wait for ever, and nothing in the pool's log said so: ``stats`` and the
``runifold_unserved_ready_tasks`` gauge did, for whoever looked. One child of a pool runs
this thread beside its worker loop: every ``interval`` it reads the ready work no live
worker serves (``operations.unserved_ready``, what ``stats`` shows) and logs one warning
per definition and version when some starts waiting, and one when none waits any more.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from ..store.base import WorkflowStore
from ..store.serving import DEFAULT_LIVE_WITHIN, unserved_ready

log = logging.getLogger("runifold_sync.stranded")


class StrandedWork:
    """The watching thread; :meth:`close` stops it."""

    def __init__(
        self, store: WorkflowStore, interval: timedelta, live_within: timedelta = DEFAULT_LIVE_WITHIN
    ):
        self._store = store
        self._interval_s = interval.total_seconds()
        self._live_within = live_within
        self._said: set[tuple[str, int]] = set()  # (definition, version) stranded when last read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runifold-stranded-work", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _loop(self) -> None:
        # The first read comes an interval after start: by then this pool's workers have
        # registered, and their own versions are not reported as unserved.
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
            except Exception as exc:  # an unreachable store: its outage is reported elsewhere
                log.debug("could not read the unserved work: %s", exc)

    def check(self) -> None:
        """Log what started or stopped waiting since the last check."""
        stranded: dict[tuple[str, int], tuple[int, str]] = {}
        for work in unserved_ready(self._store, self._live_within):
            key = (work.backlog.name, work.backlog.version)
            ready, reason = stranded.get(key, (0, work.reason))
            stranded[key] = (ready + work.backlog.ready, reason)
        for (name, version), (ready, reason) in sorted(stranded.items()):
            if (name, version) not in self._said:
                log.warning(
                    "%d ready task(s) of %r version %d wait that no live worker can claim: %s "
                    "(stats lists them; they run once a worker serving them starts)",
                    ready,
                    name,
                    version,
                    reason,
                )
        for name, version in sorted(self._said - set(stranded)):
            log.warning("no ready task of %r version %d waits unserved any more", name, version)
        self._said = set(stranded)
