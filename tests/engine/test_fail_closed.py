"""Fail-closed edges: a reconcile that raises is no evidence; a store that goes away
inside a parallel branch ends the cycle, not the task."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    EffectEvidence,
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import StoreUnavailable
from runifold_sync.outcomes import Failed
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState
from runifold_sync.store.records import Committed, Lease

LEASE = LeaseDuration(timedelta(seconds=30))


def _worker(store: SqliteWorkflowStore, workflow: Workflow) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5))


def test_a_reconcile_that_raises_fails_the_task_closed_as_ambiguous(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    calls: list[str] = []
    workflow = Workflow("reconcile-raises", 1)

    def lookup(ctx: StepContext) -> EffectEvidence:
        calls.append("reconcile")
        raise ConnectionError("payment provider unreachable")

    @workflow.effect(idempotent=False, reconcile=lookup, retry=RetryPolicy(max_attempts=2))
    def charge(ctx: StepContext) -> str:
        calls.append("charge")
        raise TimeoutError("no answer")  # the charge may or may not have happened

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return charge(ctx)

    sqlite_store.enqueue(WorkflowTask.new("reconcile-raises", 1, None, checkpoint_id="r1"))
    worker = _worker(sqlite_store, workflow)
    assert worker.run_once().kind == "retried"
    sqlite_store.set_clock_offset(timedelta(minutes=10))
    outcome = worker.run_once()
    assert isinstance(outcome, Failed) and outcome.recoverable
    assert "ambiguous effect" in outcome.reason
    assert outcome.reason.endswith(
        "resolve it with resolve_effect or on the command line: python -m runifold_sync resolve r1 "
        "'r1/charge#1' (--applied [--result JSON] | --not-applied) --actor WHO --reason WHY"
    )
    assert calls == ["charge", "reconcile"]  # never charged again without evidence
    assert sqlite_store.get_task("r1").ambiguous_effect == "r1/charge#1"


def test_a_store_outage_inside_a_branch_ends_the_cycle_and_the_task_continues_later(
    sqlite_store: SqliteWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow = Workflow("branch-outage", 1)

    @workflow.step()
    def touch(ctx: StepContext, n: int) -> int:
        return n

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> dict[str, int]:
        return ctx.parallel({"a": lambda b: touch(b, 1)})

    commit = sqlite_store.commit_checkpoint
    outage = [True]

    def commit_once_unreachable(lease: Lease, revision: int, checkpoint_json: str, **kw: Any) -> Committed:
        if outage and outage.pop():
            raise StoreUnavailable("connection terminated (simulated server restart)")
        return commit(lease, revision, checkpoint_json, **kw)

    monkeypatch.setattr(sqlite_store, "commit_checkpoint", commit_once_unreachable)
    sqlite_store.enqueue(WorkflowTask.new("branch-outage", 1, None, checkpoint_id="b1"))
    worker = _worker(sqlite_store, workflow)
    with pytest.raises(StoreUnavailable):
        worker.run_once()
    assert sqlite_store.get_task("b1").state is TaskState.LEASED  # not failed
    sqlite_store.set_clock_offset(timedelta(seconds=31))
    assert worker.run_once().kind == "completed"
