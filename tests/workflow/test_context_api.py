"""``ctx`` in a main function (and in a parallel branch) offers the authoring API only.

The engine behind it (commits, encoding, compensation, branching, the cursor) is the
worker's: a workflow that could call ``ctx.commit()`` could write progress the replay
rule never made.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)

AUTHORING_API = {
    "task_id",
    "tenant",
    "fence",  # the lease's fencing token, for the application's own conditional writes
    "sleep",
    "sleep_until",
    "wait_for_signal",
    "request_approval",
    "parallel",
    "race",
    "continue_as_new",
    "set_event",  # publishes a value for store.get_event, committed like a step boundary
    "set_attributes",  # search attributes for list_tasks(attributes=), committed as set_event
    "write_stream",  # appends to a stream store.read_stream reads, committed as set_event
    "wait_for_update",  # a signal the workflow's validator accepts before it is recorded
    "reply",  # answers an update: store.update returns it
    "start_child",
    "wait_child",
    "wait_children",
    "run_child",
    "patched",  # whether this run takes a change's new path, recorded as a marker
    "deprecate_patch",
    "now",  # store time recorded in the journal, replayed
    "wait_any",  # the first of several children, signal names and timers
}


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_ctx_class_declares_exactly_the_authoring_api() -> None:
    assert _public(WorkflowContext) == AUTHORING_API


def test_the_ctx_a_main_function_and_its_branches_receive_expose_only_the_authoring_api(
    store: WorkflowStore,
) -> None:
    seen: dict[str, Any] = {}
    workflow = Workflow("facade", 1)

    @workflow.step()
    def hello(ctx: StepContext) -> str:
        return "hi"

    def branch(ctx: WorkflowContext) -> str:
        seen["branch"] = ctx
        return hello(ctx)

    @workflow.main
    def main(ctx: WorkflowContext, _: None) -> dict[str, Any]:
        seen["main"] = ctx
        return ctx.parallel({"a": branch})

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    store.enqueue(WorkflowTask.new("facade", 1, None, checkpoint_id="f1"))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)
    )
    try:
        assert worker.run_once().kind == "completed"
    finally:
        worker.close()
    for where in ("main", "branch"):
        ctx = seen[where]
        assert type(ctx) is WorkflowContext, where
        assert _public(ctx) == AUTHORING_API, where
        for engine_method in ("commit", "encode", "compensate", "needs_compensation", "branch", "call"):
            assert not hasattr(ctx, engine_method), (where, engine_method)
    assert (seen["main"].task_id, seen["main"].fence) == ("f1", 1)


def test_a_step_called_without_a_ctx_says_how_to_call_it() -> None:
    workflow = Workflow("facade", 1)

    @workflow.step()
    def hello(ctx: StepContext) -> str:
        return "hi"

    with pytest.raises(TypeError, match="step 'hello' must be called from a workflow main function"):
        hello("not a ctx")  # type: ignore[arg-type]
