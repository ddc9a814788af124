"""The state one claim's main function and its parallel branches share."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import attrs

from .checkpoint import Checkpoint
from .models import Budget, BudgetUsage


@attrs.define
class Progress:
    """The checkpoint and its revision, shared by the main function and its parallel
    branches; the lock serializes their commits into one revision sequence."""

    checkpoint: Checkpoint
    revision: int
    lock: threading.RLock = attrs.Factory(threading.RLock)
    # A step whose result is in the checkpoint but not yet committed: it is committed
    # before the next body runs, or with the cycle's transition (complete, suspend...),
    # which saves the last step of a run its own round trip.
    unsaved: str | None = None
    # Run time (Budget.max_duration) is wall time while claimed: each tick adds the time
    # since the previous one (or since the claim) to the checkpoint's usage.
    ticked_at: float = attrs.Factory(time.monotonic)

    def tick(self, *, steps: int = 0, cost: float = 0.0) -> None:
        """Add the wall time since the last tick, and ``steps`` and ``cost`` if given,
        to usage in one update (caller holds the lock)."""
        now = time.monotonic()
        elapsed_s = now - self.ticked_at
        self.checkpoint.usage = self.checkpoint.usage.add(steps=steps, cost=cost, elapsed_s=elapsed_s)
        self.ticked_at = now


@attrs.frozen
class BranchScope:
    """What a parallel branch's context knows of its branch: the key that scopes its
    call ids, its budget share and the signal to stop."""

    key: str  # "parallel#1/a": scopes the branch's call ids and its journal
    reserve: Budget | None
    stop: threading.Event  # set when the branch must stop at its next step boundary
    # Shares of the parallel call's unfinished reserved branches, by key; the runner drops
    # a branch's entry when it finishes. An unreserved branch may not spend them.
    held: Mapping[str, Budget] = attrs.Factory(dict)

    def held_for_others(self, branch_usage: Mapping[str, BudgetUsage]) -> tuple[int, float]:
        """Steps and cost reserved by unfinished sibling branches and not yet spent."""
        steps, cost = 0, 0.0
        for key, share in tuple(self.held.items()):  # a snapshot: the runner removes entries
            if key == self.key:
                continue
            used = branch_usage.get(key, BudgetUsage())
            steps += max((share.max_steps or 0) - used.steps, 0)
            cost += max((share.max_cost or 0) - used.cost, 0.0)
        return steps, cost
