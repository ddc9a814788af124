"""Tasks a routed claim may still hand to a worker that cannot run them: the race the
worker's hand-back (``execution.py``) remains the safety net for."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.checkpoint import Checkpoint
from runifold_sync.models import DefinitionIdentity


def checkpointed_by_other_steps(
    store: WorkflowStore, name: str, version: int, task_id: str, fingerprint: str = "other-steps"
) -> None:
    """Enqueue a task whose checkpoint another deploy's steps (``fingerprint``) wrote
    while a claim without routes held it (a tool's, or a release before routing), so its
    row names no fingerprint: any worker serving ``name`` ``version`` claims it, and one
    whose steps differ hands it back. Other ready tasks are not touched (its priority is
    the highest)."""
    store.enqueue(WorkflowTask.new(name, version, None, checkpoint_id=task_id, priority=1_000_000))
    [claimed] = store.claim(WorkerId.parse("a-tool"), LeaseDuration(timedelta(seconds=30)))
    assert claimed.lease.task_id == task_id
    head = Checkpoint(DefinitionIdentity(name, version, fingerprint)).write(task_id, 1 << 20).head_json
    store.commit_checkpoint(claimed.lease, claimed.revision, head)
    store.release(claimed.lease, delay=timedelta(0), reason="left by a tool")
