"""Tasks a worker claimed before their turn: the rest of a claim batch, or the next task
claimed in a completion's transaction. Their leases are kept alive by the heartbeat
thread until the worker comes to them, and they are handed back unstarted when it stops."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import attrs

from ..engine.logs import task_fields
from ..errors import LeaseLostError, StoreUnavailable
from ..model import crashpoints
from ..model.outcomes import LeaseLost
from ..store.records import ClaimedTask, ClaimRequest

if TYPE_CHECKING:
    from ..model.cancellation import CancellationToken
    from ..store.base import WorkflowStore
    from .heartbeat import LeaseKeeper

log = logging.getLogger("runifold_sync.worker.worker")


class ClaimedAhead:
    def __init__(
        self, store: WorkflowStore, keeper: LeaseKeeper, request: Callable[[], ClaimRequest]
    ) -> None:
        self._store = store
        self._keeper = keeper
        self._request = request  # what a completion claims for the next cycle (as of now)
        self._tasks: deque[ClaimedTask] = deque()
        # This cycle's run_once(claim_next=..., stopping=...): see completion_claim.
        self.claim_next = False
        self.stopping: CancellationToken | None = None

    def hold(self, claimed: list[ClaimedTask]) -> None:
        """Keep tasks claimed for later cycles, their leases extended by the heartbeat."""
        if claimed:
            self._tasks.extend(claimed)
            self._keeper.hold([c.lease for c in claimed])

    @property
    def holding(self) -> bool:
        """Whether tasks claimed ahead wait for their turn."""
        return bool(self._tasks)

    def next(self) -> tuple[ClaimedTask, float] | LeaseLost | None:
        """The next held task, with its latest lease and the monotonic time that lease was
        extended from; ``LeaseLost`` when its lease ran out while it waited (another
        worker has it now); None when no task is held (tasks the heartbeat thread handed
        back are skipped)."""
        while self._tasks:
            task = self._tasks.popleft()
            held = self._keeper.take(task.lease.task_id)
            if held is not None:
                lease, extended_at = held
                return attrs.evolve(task, lease=lease), extended_at
            if not self._keeper.was_handed_back(task.lease.task_id):
                self._keeper.forgive_if_cut_off(task.lease, task.revision)
                return LeaseLost(task.lease.task_id, task.lease.fencing_token)
        return None

    def completion_claim(self) -> ClaimRequest | None:
        """The claim a completion makes in its own transaction, saving a commit per task:
        only for a loop that runs the next task at once (``claim_next``), when no task is
        held already, and never once the loop's stop token is cancelled (a SIGTERM during
        the cycle), since a stopping worker takes no new work, nor while the heartbeat
        thread cannot reach the store (a task claimed then could not be kept)."""
        stopping = self.stopping is not None and self.stopping.cancelled
        if self.claim_next and not self._tasks and not stopping and not self._keeper.cut_off:
            return self._request()
        return None

    def release(self) -> None:
        """Give held tasks back to the queue (the claim not counted as an attempt), so
        other workers take them now rather than after their leases expire."""
        while self._tasks:
            task = self._tasks.popleft()
            held = self._keeper.take(task.lease.task_id)
            if held is None:
                continue
            try:
                with crashpoints.transition("hand_back"):
                    self._store.release(
                        held[0], delay=timedelta(0), reason="handed back unstarted by a stopping worker"
                    )
            except (LeaseLostError, StoreUnavailable) as exc:
                log.warning("could not hand back a task claimed ahead: %s", exc, extra=task_fields(held[0]))
