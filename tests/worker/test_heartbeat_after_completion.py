"""The heartbeat never reports a lease lost for a task its own worker has just ended.

The race, driven here: the completion commits, and before the worker's cycle unwatches
the lease, a heartbeat of it lands and the store refuses it (the task is terminal). That
refusal used to be logged as "lease lost", 31 times in a loaded run, for tasks the same
worker had completed 15 ms earlier, and operators are told to act on lease losses."""

from __future__ import annotations

import logging
import threading
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
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import LeaseLostError
from runifold_sync.outcomes import Completed
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.records import Lease

flow = Workflow("quick", 1)


@flow.step()
def one(ctx: StepContext) -> int:
    return 1


@flow.main
def main(ctx: WorkflowContext, _input: None) -> int:
    return one(ctx)


class AnswersLate(SqliteWorkflowStore):
    """Holds the answer of a completion until a heartbeat of the completed task has been
    refused, so the refusal always lands while the cycle still watches the lease."""

    refused_after_completion: threading.Event
    completed = False

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        done = super().complete(*args, **kwargs)
        self.completed = True
        assert self.refused_after_completion.wait(10), "no heartbeat came"
        return done

    def heartbeat(self, lease: Lease, duration: LeaseDuration) -> Lease:
        try:
            return super().heartbeat(lease, duration)
        except LeaseLostError:
            if self.completed:
                self.refused_after_completion.set()
            raise


def test_a_heartbeat_refused_after_the_workers_own_completion_is_no_lease_lost(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = AnswersLate.open(tmp_path / "workflows.db")
    store.refused_after_completion = threading.Event()
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    store.enqueue(WorkflowTask.new("quick", 1, None, checkpoint_id="q1"))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=2)), timedelta(seconds=0.02)
    )
    try:
        with caplog.at_level(logging.DEBUG, logger="runifold_sync"):
            assert worker.run_once() == Completed("q1", 1)
    finally:
        worker.close()
        store.close()
    assert store.refused_after_completion.is_set()  # the race happened
    assert [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()] == []
