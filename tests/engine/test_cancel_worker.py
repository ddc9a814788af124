"""Cancellation seen by an in-process ``WorkflowWorker``, on SQLite and PostgreSQL, with
the cancel sent through another store (as another process would).

The heartbeat interval here is far longer than any test, so a running task can only
learn of a cancel from its own step-boundary commits; and a waiting or queued task with
completed steps to undo is undone by the worker that claims it next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
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
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Cancelled, Idle, Retried, Suspended
from runifold_sync.store import TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import Backend

pytestmark = pytest.mark.timeout(120)

WAIT_S = 60.0
NOTE = "cancelled by ops: customer left"
LOG: list[str] = []  # what steps and compensations did, in order
STEP_ENTERED = threading.Event()
RELEASE_STEP = threading.Event()


@pytest.fixture(autouse=True)
def _reset_module_state() -> Iterator[None]:
    LOG.clear()
    STEP_ENTERED.clear()
    RELEASE_STEP.clear()
    yield
    RELEASE_STEP.set()  # never leave a worker thread blocked after a failed test


def _many_steps() -> Workflow:
    """``n`` short steps, each with a compensation."""
    wf = Workflow("many-steps", 1)

    @wf.step()
    def work(ctx: StepContext, i: int) -> int:
        time.sleep(0.02)
        LOG.append(f"work {i}")
        return i

    @wf.compensate_for("work")
    def unwork(ctx: StepContext, i: int) -> None:
        LOG.append(f"unwork {i}")

    @wf.main
    def main(ctx: WorkflowContext, n: int) -> int:
        return sum(work(ctx, i) for i in range(n))

    return wf


def _last_step_blocks() -> Workflow:
    """reserve, then a final step that blocks until the test releases it."""
    wf = Workflow("last-step-blocks", 1)

    @wf.step()
    def reserve(ctx: StepContext) -> str:
        LOG.append("reserve")
        return "r1"

    @wf.step()
    def finish(ctx: StepContext, reservation: str) -> str:
        STEP_ENTERED.set()
        assert RELEASE_STEP.wait(WAIT_S), "the test never released the step"
        LOG.append("finish")
        return f"done {reservation}"

    @wf.compensate_for("reserve")
    def unreserve(ctx: StepContext, reservation: str) -> None:
        LOG.append(f"unreserve {reservation}")

    @wf.compensate_for("finish")
    def unfinish(ctx: StepContext, result: str) -> None:
        LOG.append(f"unfinish {result}")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return finish(ctx, reserve(ctx))

    return wf


def _trip() -> Workflow:
    """book 1, then a wait (timer, signal, or a failing step's backoff), then book 2."""
    wf = Workflow("trip", 1, signals=["go"])

    @wf.step()
    def book(ctx: StepContext, n: int) -> int:
        LOG.append(f"book {n}")
        return n

    @wf.compensate_for("book")
    def unbook(ctx: StepContext, n: int) -> None:
        LOG.append(f"unbook {n}")

    @wf.step(
        retry=RetryPolicy(max_attempts=3, initial_backoff=timedelta(hours=1), max_backoff=timedelta(hours=2))
    )
    def flaky(ctx: StepContext) -> None:
        raise ConnectionError("provider down")

    @wf.main
    def main(ctx: WorkflowContext, wait: str) -> None:
        book(ctx, 1)
        if wait == "timer":
            ctx.sleep(timedelta(hours=1))
        elif wait == "signal":
            ctx.wait_for_signal("go")
        else:
            flaky(ctx)
        book(ctx, 2)

    return wf


def _worker(store: WorkflowStore) -> WorkflowWorker:
    registry = WorkflowRegistry()
    for workflow in (_many_steps(), _last_step_blocks(), _trip()):
        registry.register(WorkflowDefinition(workflow))
    # A 10-minute heartbeat: no beat comes round while these tests run.
    return WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(minutes=20)), timedelta(minutes=10)
    )


def _run_in_thread(worker: WorkflowWorker) -> tuple[threading.Thread, list[Any]]:
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.append(worker.run_once()), name="test-worker")
    thread.start()
    return thread, outcomes


def _checkpoint(store: WorkflowStore, task_id: str) -> Checkpoint:
    checkpoint = read_checkpoint(store, task_id)
    assert checkpoint is not None
    return checkpoint


def test_a_running_task_stops_at_its_next_step_boundary_without_a_heartbeat(backend: Backend) -> None:
    store, operator = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("many-steps", 1, 500, checkpoint_id="m1"))
    worker = _worker(store)
    thread, outcomes = _run_in_thread(worker)
    try:
        deadline = time.monotonic() + WAIT_S
        while len(LOG) < 5:
            assert time.monotonic() < deadline and thread.is_alive(), "the task never got going"
            time.sleep(0.005)

        assert operator.cancel("m1", "ops", "customer left") is TaskState.LEASED
        done_at_cancel = len(LOG)
        thread.join(WAIT_S)
        assert not thread.is_alive()
    finally:
        thread.join(WAIT_S)
        worker.close()

    assert outcomes == [Cancelled("m1", NOTE)]
    worked = [line for line in LOG if line.startswith("work")]
    # The step running when the cancel landed may finish; the next boundary stops the task.
    assert done_at_cancel <= len(worked) <= done_at_cancel + 1 < 500
    undone = [line for line in LOG if line.startswith("unwork")]
    assert undone == [f"un{line}" for line in reversed(worked)]  # every step undone, newest first
    record = operator.get_task("m1")
    assert (record.state, record.reason) == (TaskState.CANCELLED, NOTE)
    history = operator.history("m1")
    requested = [e for e in history if e.kind == "cancel_requested"]
    assert [e.detail for e in requested] == [{"actor": "ops", "reason": "customer left"}]
    assert history[-1].kind == "cancelled"
    assert _checkpoint(operator, "m1").phase == "cancelled"


def test_a_cancel_that_lands_during_the_last_step_wins_over_the_completion(backend: Backend) -> None:
    store, operator = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("last-step-blocks", 1, None, checkpoint_id="l1"))
    worker = _worker(store)
    thread, outcomes = _run_in_thread(worker)
    try:
        assert STEP_ENTERED.wait(WAIT_S)
        assert operator.cancel("l1", "ops", "customer left") is TaskState.LEASED
        RELEASE_STEP.set()
        thread.join(WAIT_S)
        assert not thread.is_alive()
    finally:
        RELEASE_STEP.set()
        thread.join(WAIT_S)
        worker.close()

    assert outcomes == [Cancelled("l1", NOTE)]
    # The last step ran and is kept, then everything is undone newest first.
    assert LOG == ["reserve", "finish", "unfinish done r1", "unreserve r1"]
    checkpoint = _checkpoint(operator, "l1")
    assert [(e.call_id, e.status) for e in checkpoint.journal] == [
        ("reserve#1", "done"),
        ("finish#1", "done"),
    ]
    assert (checkpoint.phase, checkpoint.compensated) == ("cancelled", ["finish#1", "reserve#1"])
    record = operator.get_task("l1")
    assert (record.state, record.outcome, record.result_json) == (TaskState.CANCELLED, None, None)
    assert "completed" not in [e.kind for e in operator.history("l1")]


@pytest.mark.parametrize("wait", ["timer", "signal", "backoff"])
def test_cancelling_a_parked_task_with_a_completed_step_runs_its_compensation(
    backend: Backend, wait: str
) -> None:
    store, operator = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("trip", 1, wait, checkpoint_id="p1"))
    worker = _worker(store)
    try:
        parked = worker.run_once()
        assert isinstance(parked, Retried if wait == "backoff" else Suspended)

        assert operator.cancel("p1", "ops", "customer left") is TaskState.QUEUED

        assert worker.run_once() == Cancelled("p1", NOTE)
        assert worker.run_once() == Idle()
    finally:
        worker.close()
    assert LOG == ["book 1", "unbook 1"]  # book 2 never ran
    record = operator.get_task("p1")
    assert (record.state, record.reason) == (TaskState.CANCELLED, NOTE)
    kinds = [e.kind for e in operator.history("p1")]
    assert kinds[-3:] == ["cancel_requested", "claimed", "cancelled"]
    checkpoint = _checkpoint(operator, "p1")
    assert (checkpoint.undo, checkpoint.compensated, checkpoint.compensating_for) == (
        ["book#1"],
        ["book#1"],
        "cancel",
    )
