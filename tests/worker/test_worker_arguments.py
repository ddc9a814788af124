"""A worker's arguments are checked where they are given, with an InvalidArgument
naming them, before any task is claimed. Before, ``tracer=5`` would raise a bare
AttributeError, ``on_outcome=5`` a TypeError after the first task had run, and
``run_once(stopping=5)`` or ``claim_next="yes"`` were accepted and the completion then
raised AttributeError, leaving the task leased."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState

quick = Workflow("quick", 1)


@quick.main
def quick_main(ctx: WorkflowContext, _input: None) -> str:
    return "done"


def _worker(store: SqliteWorkflowStore, **options: Any) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(quick))
    lease = LeaseDuration(timedelta(seconds=30))
    return WorkflowWorker(store, registry, WorkerId.parse("w1"), lease, timedelta(seconds=10), **options)


def test_a_tracer_that_is_not_one_is_refused_naming_it(sqlite_store: SqliteWorkflowStore) -> None:
    with pytest.raises(
        InvalidArgument, match="^tracer must be a CycleTracer \\(with cycle and close\\) or None, got 5$"
    ):
        _worker(sqlite_store, tracer=5)


def test_a_tracer_provider_that_is_not_one_is_refused_naming_it() -> None:
    pytest.importorskip("opentelemetry")
    from runifold_sync.ops.tracing import Tracing

    with pytest.raises(
        InvalidArgument, match="^tracer_provider must be an OpenTelemetry TracerProvider, got 5$"
    ):
        Tracing(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.run_once(stopping=5), "stopping must be a CancellationToken, got 5"),
        (lambda w: w.run_once(claim_next="yes"), "claim_next must be True or False, got 'yes'"),
        (
            lambda w: w.run(CancellationToken(), on_outcome=5),
            "on_outcome must be a function of a RunOutcome or None, got 5",
        ),
    ],
    ids=["stopping", "claim_next", "on_outcome"],
)
def test_a_bad_cycle_argument_is_refused_before_any_task_is_claimed(
    sqlite_store: SqliteWorkflowStore, call: Callable[[WorkflowWorker], Any], message: str
) -> None:
    task_id = sqlite_store.enqueue(WorkflowTask.new("quick", 1, None)).task_id
    worker = _worker(sqlite_store)
    try:
        with pytest.raises(InvalidArgument, match=f"^{message}$"):
            call(worker)
    finally:
        worker.close()
    assert sqlite_store.get_task(task_id).state is TaskState.QUEUED  # not claimed, not left leased
