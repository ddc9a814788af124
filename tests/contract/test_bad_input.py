"""Bad input, each refused or contained with an error naming it, nothing else lost or
stuck, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    Failed,
    InvalidArgument,
    LeaseDuration,
    StepContext,
    TaskState,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)

LEASE = LeaseDuration(timedelta(seconds=30))
SQL_NAME = "x'); DROP TABLE runifold_tasks; --"


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _worker(store: WorkflowStore, workflow: Workflow) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5))


def test_names_with_sql_metacharacters_are_stored_as_plain_text(store: WorkflowStore) -> None:
    task = WorkflowTask.new(SQL_NAME, 1, {"q": SQL_NAME}, tenant=SQL_NAME, checkpoint_id=SQL_NAME)
    assert store.enqueue(task).created
    record = store.get_task(SQL_NAME)
    assert (record.definition_name, record.tenant, record.input) == (SQL_NAME, SQL_NAME, {"q": SQL_NAME})
    assert [t.task_id for t in store.list_tasks(tenant=SQL_NAME)] == [SQL_NAME]


def test_deeply_nested_input_is_refused_at_enqueue_naming_the_problem() -> None:
    with pytest.raises(InvalidArgument, match="not JSON-serializable: RecursionError"):
        WorkflowTask.new("deep", 1, _nested(100_000))


def test_a_step_output_that_cannot_be_stored_fails_only_its_task(store: WorkflowStore) -> None:
    workflow = Workflow("bad-output", 1)

    @workflow.step()
    def produce(ctx: StepContext, kind: str) -> Any:
        return {"deep": _nested(100_000), "object": object(), "nan": float("nan")}.get(kind, kind)

    @workflow.main
    def main(ctx: WorkflowContext, kind: str) -> Any:
        return produce(ctx, kind)

    for kind in ("deep", "object", "nan", "fine"):
        store.enqueue(WorkflowTask.new("bad-output", 1, kind, checkpoint_id=kind))
    worker = _worker(store, workflow)
    outcomes = {o.task_id: o for o in (worker.run_once() for _ in range(4))}
    for kind in ("deep", "object", "nan"):
        outcome = outcomes[kind]
        assert isinstance(outcome, Failed)
        assert "output of 'produce#1' cannot be stored as JSON" in outcome.reason
    assert outcomes["fine"].kind == "completed" and store.get_task("fine").result == "fine"


def test_a_corrupt_checkpoint_fails_its_task_closed_and_others_go_on(store: WorkflowStore) -> None:
    workflow = Workflow("corruptible", 1)

    @workflow.step()
    def one(ctx: StepContext) -> int:
        return 1

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> int:
        one(ctx)
        ctx.sleep(timedelta(seconds=5))
        return one(ctx)

    for task_id in ("corrupt", "healthy"):
        store.enqueue(WorkflowTask.new("corruptible", 1, None, checkpoint_id=task_id))
    # Corrupt one task's checkpoint under its own lease, as a buggy tool might.
    (claimed,) = store.claim(WorkerId.parse("vandal"), LEASE)
    assert claimed.lease.task_id == "corrupt"
    store.commit_checkpoint(claimed.lease, claimed.revision, '{"format_version": 1, "journal": "nonsense"}')
    store.release(claimed.lease, delay=timedelta(0), reason="vandalised")
    worker = _worker(store, workflow)
    outcomes = {o.task_id: o for o in (worker.run_once(), worker.run_once())}
    corrupt = outcomes["corrupt"]
    assert isinstance(corrupt, Failed) and "checkpoint of task 'corrupt' is corrupt" in corrupt.reason
    assert outcomes["healthy"].kind == "suspended"
    assert store.get_task("corrupt").state is TaskState.TERMINAL
