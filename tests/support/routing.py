"""Tasks a routed claim may still hand to a worker that cannot run them: the race the
worker's hand-back (``execution.py``) remains the safety net for."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.model.values import DefinitionIdentity


def leave_checkpoint_without_fingerprint(store: WorkflowStore, fingerprint: str) -> str:
    """Take the first ready task with a claim without routes (a tool's, or a release
    before routing), commit an empty checkpoint of its definition written by steps with
    ``fingerprint`` and hand it back: its row names no fingerprint, so any worker serving
    its version claims it once (a worker with other steps hands it back, and that claim
    records ``fingerprint`` from the head). Returns its id."""
    [claimed] = store.claim(WorkerId.parse("a-tool"), LeaseDuration(timedelta(seconds=30)))
    ident = DefinitionIdentity(claimed.definition_name, claimed.definition_version, fingerprint)
    head = Checkpoint(ident).write(claimed.lease.task_id, 1 << 20).head_json
    store.commit_checkpoint(claimed.lease, claimed.revision, head)
    store.release(claimed.lease, delay=timedelta(0), reason="left by a tool")
    return claimed.lease.task_id


def checkpointed_by_other_steps(
    store: WorkflowStore, name: str, version: int, task_id: str, fingerprint: str = "other-steps"
) -> None:
    """Enqueue a task (ahead of every other ready one) and leave it as
    :func:`leave_checkpoint_without_fingerprint` does, checkpointed by ``fingerprint``."""
    store.enqueue(WorkflowTask.new(name, version, None, checkpoint_id=task_id, priority=1_000_000))
    assert leave_checkpoint_without_fingerprint(store, fingerprint) == task_id
