"""Cancellation through ``store.cancel``, seen by an in-process ``WorkflowWorker`` on a
real SQLite file: at once for queued and waiting tasks, at the next step boundary for a
running one (here its heartbeat carries the request; tests/engine/test_cancel_worker.py
covers step-boundary commits on both stores), and never undoing completed effects that
have no compensation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
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
from runifold_sync.errors import SignalRefused
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Cancelled, Completed, Idle, Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import Lease, TaskState
from runifold_sync.store.checkpoints import read_checkpoint

THREAD_TIMEOUT_S = 10.0
CALLS: list[str] = []
LEDGER: list[tuple[str, str | None]] = []  # the "external system" an effect writes to
STEP_ENTERED = threading.Event()
RELEASE_STEP = threading.Event()


@pytest.fixture(autouse=True)
def _reset_module_state() -> Iterator[None]:
    CALLS.clear()
    LEDGER.clear()
    STEP_ENTERED.clear()
    RELEASE_STEP.clear()
    yield
    RELEASE_STEP.set()  # never leave a worker thread blocked after a failed test


class WatchedStore(SqliteWorkflowStore):
    """Counts heartbeats that carried a cancel request back to the worker."""

    cancel_beats = 0

    def heartbeat(self, lease: Lease, duration: LeaseDuration) -> Lease:
        renewed = super().heartbeat(lease, duration)
        if renewed.cancel_requested is not None:
            self.cancel_beats += 1
        return renewed


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[WatchedStore]:
    opened = WatchedStore.open(sqlite_path)
    assert isinstance(opened, WatchedStore)
    yield opened
    opened.close()


def _fulfilment() -> Workflow:
    """charge (a non-idempotent effect) -> pack (blocks until released) -> then what the
    input names: another step, a timer or a signal wait."""
    wf = Workflow("fulfilment", 1, signals=["picked-up"])

    @wf.effect(idempotent=False)
    def charge_card(ctx: StepContext, order_id: str) -> str:
        LEDGER.append((f"charge {order_id}", ctx.idempotency_key))
        return f"ch_{order_id}"

    @wf.step()
    def pack(ctx: StepContext, order_id: str) -> str:
        CALLS.append("pack started")
        STEP_ENTERED.set()
        assert RELEASE_STEP.wait(THREAD_TIMEOUT_S), "the test never released the step"
        CALLS.append("pack finished")
        return f"box-{order_id}"

    @wf.step()
    def ship(ctx: StepContext, box: str) -> str:
        CALLS.append("ship")
        return f"shipped {box}"

    @wf.main
    def main(ctx: WorkflowContext, order: dict[str, str]) -> Any:
        charge_card(ctx, order["id"])
        box = pack(ctx, order["id"])
        if order["then"] == "timer":
            ctx.sleep(timedelta(seconds=60))
        elif order["then"] == "signal":
            ctx.wait_for_signal("picked-up")
        return ship(ctx, box)

    return wf


def _worker(store: SqliteWorkflowStore, *, lease_s: float = 30, heartbeat_s: float = 10) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_fulfilment()))
    return WorkflowWorker(
        store,
        registry,
        WorkerId.parse("w1"),
        LeaseDuration(timedelta(seconds=lease_s)),
        timedelta(seconds=heartbeat_s),
    )


@pytest.fixture
def worker(store: WatchedStore) -> Iterator[WorkflowWorker]:
    w = _worker(store)
    yield w
    w.close()


def _enqueue(store: SqliteWorkflowStore, then: str = "step") -> str:
    task = WorkflowTask.new("fulfilment", 1, {"id": "o1", "then": then})
    return store.enqueue(task).task_id


def _checkpoint(store: SqliteWorkflowStore, task_id: str) -> Checkpoint:
    checkpoint = read_checkpoint(store, task_id)
    assert checkpoint is not None
    return checkpoint


def test_cancelling_a_queued_task_ends_it_at_once_and_workers_find_nothing(
    store: WatchedStore, worker: WorkflowWorker
) -> None:
    task_id = _enqueue(store)

    assert store.cancel(task_id, actor="ops", reason="duplicate order") is TaskState.CANCELLED

    assert worker.run_once() == Idle()
    record = store.get_task(task_id)
    assert (record.state, record.reason) == (TaskState.CANCELLED, "cancelled by ops: duplicate order")
    assert LEDGER == [] and CALLS == []


def test_cancelling_a_task_waiting_on_a_timer_ends_it_at_once(
    store: WatchedStore, worker: WorkflowWorker
) -> None:
    RELEASE_STEP.set()
    task_id = _enqueue(store, then="timer")
    assert isinstance(worker.run_once(), Suspended)

    assert store.cancel(task_id, actor="ops", reason="customer left") is TaskState.CANCELLED

    assert store.get_task(task_id).state is TaskState.CANCELLED
    store.set_clock_offset(timedelta(seconds=61))  # the timer's due time passes
    assert worker.run_once() == Idle()
    assert "ship" not in CALLS


def test_a_task_cancelled_while_waiting_for_a_signal_refuses_the_signal(
    store: WatchedStore, worker: WorkflowWorker
) -> None:
    RELEASE_STEP.set()
    task_id = _enqueue(store, then="signal")
    assert isinstance(worker.run_once(), Suspended)
    store.cancel(task_id, actor="ops", reason="customer left")

    with pytest.raises(SignalRefused, match="the task is cancelled"):
        store.send_signal(task_id, "picked-up", None, signal_id="p1", sender="courier")
    assert worker.run_once() == Idle()
    assert "ship" not in CALLS


@pytest.mark.timeout(30)
@pytest.mark.parametrize("then", ["step", "timer", "signal"])
def test_a_running_task_stops_at_the_next_boundary_after_its_heartbeat_sees_the_cancel(
    store: WatchedStore, then: str
) -> None:
    worker = _worker(store, lease_s=1, heartbeat_s=0.2)
    task_id = _enqueue(store, then=then)
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.append(worker.run_once()), name="test-worker")
    thread.start()
    try:
        assert STEP_ENTERED.wait(THREAD_TIMEOUT_S)

        assert store.cancel(task_id, actor="ops", reason="customer cancelled") is TaskState.LEASED
        assert store.get_task(task_id).state is TaskState.LEASED  # the step is still running
        # Two beats: after the first one returned, the heartbeat thread has set its flag.
        deadline = time.monotonic() + THREAD_TIMEOUT_S
        while store.cancel_beats < 2:
            assert time.monotonic() < deadline, "no heartbeat carried the cancel request"
            time.sleep(0.02)
        RELEASE_STEP.set()
        thread.join(THREAD_TIMEOUT_S)
        assert not thread.is_alive()
    finally:
        RELEASE_STEP.set()
        thread.join(THREAD_TIMEOUT_S)
        worker.close()

    assert outcomes == [Cancelled(task_id, "cancelled by ops: customer cancelled")]
    assert CALLS == ["pack started", "pack finished"]  # pack completed; ship never started
    checkpoint = _checkpoint(store, task_id)
    assert [(e.call_id, e.status) for e in checkpoint.journal] == [
        ("charge_card#1", "done"),
        ("pack#1", "done"),
    ]
    assert checkpoint.journal[1].output == "box-o1"
    assert checkpoint.phase == "cancelled"
    record = store.get_task(task_id)
    assert (record.state, record.reason) == (TaskState.CANCELLED, "cancelled by ops: customer cancelled")
    kinds = [e.kind for e in store.history(task_id)]
    assert kinds[-2:] == ["cancel_requested", "cancelled"]
    assert "suspended" not in kinds


@pytest.mark.timeout(30)
def test_cancelling_a_running_task_does_not_undo_its_completed_effect(store: WatchedStore) -> None:
    worker = _worker(store, lease_s=1, heartbeat_s=0.2)
    task_id = _enqueue(store)
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.append(worker.run_once()), name="test-worker")
    thread.start()
    try:
        assert STEP_ENTERED.wait(THREAD_TIMEOUT_S)
        store.cancel(task_id, actor="ops", reason="customer cancelled")
        deadline = time.monotonic() + THREAD_TIMEOUT_S
        while store.cancel_beats < 2:
            assert time.monotonic() < deadline, "no heartbeat carried the cancel request"
            time.sleep(0.02)
    finally:
        RELEASE_STEP.set()
        thread.join(THREAD_TIMEOUT_S)

    assert isinstance(outcomes[0], Cancelled)
    assert LEDGER == [("charge o1", f"{task_id}/charge_card#1")]  # charged once, never reversed
    (charge, _pack) = _checkpoint(store, task_id).journal
    assert (charge.kind, charge.status, charge.output) == ("effect", "done", "ch_o1")
    assert worker.run_once() == Idle()  # nothing runs afterwards to compensate
    worker.close()
    assert LEDGER == [("charge o1", f"{task_id}/charge_card#1")]


class SimulatedCrash(BaseException):
    """Escapes every ``except Exception``: the worker process 'dies' mid-step."""


def _crashes_once() -> Workflow:
    wf = Workflow("crashes-once", 1)

    @wf.step()
    def first(ctx: StepContext) -> None:
        CALLS.append("first")
        if CALLS.count("first") == 1:
            raise SimulatedCrash()

    @wf.step()
    def second(ctx: StepContext) -> None:
        CALLS.append("second")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        first(ctx)
        second(ctx)

    return wf


def test_a_cancel_requested_while_the_worker_died_stops_the_worker_that_takes_over(
    store: WatchedStore,
) -> None:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_crashes_once()))
    workers = [
        WorkflowWorker(
            store, registry, WorkerId.parse(name), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)
        )
        for name in ("dies", "takes-over")
    ]
    task_id = store.enqueue(WorkflowTask.new("crashes-once", 1, None)).task_id
    try:
        with pytest.raises(SimulatedCrash):
            workers[0].run_once()
        assert store.cancel(task_id, actor="ops", reason="stop it") is TaskState.LEASED
        store.set_clock_offset(timedelta(seconds=31))  # the dead worker's lease expires

        outcome = workers[1].run_once()
    finally:
        for w in workers:
            w.close()

    assert outcome == Cancelled(task_id, "cancelled by ops: stop it")
    assert "second" not in CALLS
    assert store.get_task(task_id).state is TaskState.CANCELLED


def test_an_operator_requeue_clears_a_cancel_request_the_failed_run_never_honoured(
    store: WatchedStore,
) -> None:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_crashes_once()))
    CALLS.append("first")  # so "first" does not crash: this test is about the requeue
    task_id = store.enqueue(WorkflowTask.new("crashes-once", 1, None)).task_id
    (claimed,) = store.claim(WorkerId.parse("w0"), LeaseDuration(timedelta(seconds=30)))
    assert store.cancel(task_id, actor="ops", reason="stop it") is TaskState.LEASED
    store.fail(claimed.lease, claimed.revision, None, reason="a step failed before the boundary")
    store.requeue(task_id, actor="ops", reason="try again after all")

    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)
    )
    try:
        outcome = worker.run_once()
    finally:
        worker.close()

    assert outcome == Completed(task_id, None)
    assert CALLS == ["first", "first", "second"]
