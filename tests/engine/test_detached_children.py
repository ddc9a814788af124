"""Detached children, on every backend: ``ctx.start_child(..., detached=True)`` starts a
child that cancelling its parent does not cancel (an attached sibling is cancelled in
the same transaction, as before); the detached one stays the parent's child (listed,
``detached`` on its record) and runs to its own end, on the queue it was started on.
A bad ``detached`` is refused at the call."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.outcomes import Completed, Suspended
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.worker.settings import WorkerSettings
from tests.support.backends import contract_backend
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

audit = Workflow("audit", 1)


@audit.main
def audit_main(ctx: WorkflowContext, order: str) -> str:
    return f"audited {order}"


order = Workflow("order", 1)


@order.main
def order_main(ctx: WorkflowContext, name: str) -> Any:
    ctx.start_child("audit", 1, name, checkpoint_id=f"{name}-audit", detached=True, queue="audits")
    reserve = ctx.start_child("audit", 1, name, checkpoint_id=f"{name}-reserve")
    return ctx.wait_child(reserve)


def _cycle(store: WorkflowStore, queues: tuple[str, ...] = ("default",)) -> Any:
    definitions = (WorkflowDefinition(order), WorkflowDefinition(audit))
    if queues == ("default",):
        return run_cycle(store, *definitions)
    registry = WorkflowRegistry()
    for definition in definitions:
        registry.register(definition)
    worker = WorkflowWorker(
        store,
        registry,
        WorkerId.parse("audits"),
        LeaseDuration(timedelta(seconds=30)),
        timedelta(seconds=5),
        settings=WorkerSettings(queues=queues),
    )
    try:
        return worker.run_once()
    finally:
        worker.close()


def test_a_detached_child_outlives_its_parents_cancel(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("order", 1, "o1", checkpoint_id="o1"))
    assert isinstance(_cycle(store), Suspended)  # both children queued; the parent waits
    detached, attached = store.get_task("o1-audit"), store.get_task("o1-reserve")
    assert (detached.parent_id, detached.detached, detached.queue) == ("o1", True, "audits")
    assert (attached.parent_id, attached.detached, attached.queue) == ("o1", False, "default")

    assert store.cancel("o1", "alice", "order withdrawn") is TaskState.CANCELLED
    assert store.get_task("o1-reserve").state is TaskState.CANCELLED
    assert store.get_task("o1-audit").state is TaskState.QUEUED  # not cancelled
    assert not any(e.kind == "cancelled" for e in store.history("o1-audit"))
    assert sorted(t.task_id for t in store.list_tasks(parent="o1")) == ["o1-audit", "o1-reserve"]

    # It runs to its own end, on its own queue (a worker of 'default' does not take it).
    assert _cycle(store).kind == "idle"
    assert _cycle(store, ("audits",)) == Completed("o1-audit", "audited o1")
    done = store.get_task("o1-audit")
    assert (done.state, done.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)


def test_detached_must_be_a_boolean_and_belongs_to_a_child(store: WorkflowStore) -> None:
    bad = Workflow("bad-detach", 1)

    @bad.main
    def bad_main(ctx: WorkflowContext, _: None) -> str:
        try:
            ctx.start_child("audit", 1, "x", detached="yes")  # type: ignore[arg-type]
        except InvalidArgument as exc:
            return str(exc)
        return "accepted"

    store.enqueue(WorkflowTask.new("bad-detach", 1, None, checkpoint_id="b1"))
    assert run_cycle(store, WorkflowDefinition(bad), WorkflowDefinition(audit)) == Completed(
        "b1", "detached must be True or False, got 'yes'"
    )
    task = WorkflowTask.new("audit", 1, "x", checkpoint_id="lonely")
    with pytest.raises(InvalidArgument, match="'lonely' is detached with no parent"):
        store.enqueue(attrs.evolve(task, detached=True))
