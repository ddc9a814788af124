"""Schedules created at run time, on every backend: ``store.create_schedule`` stores one
beside the schedules registries declare (active from now, audited), every worker whose
registry has its workflow version ticks it from its next look with no restart, on the
schedule's own queue; ``store.delete_schedule`` deletes it and no tick follows. A name
taken is refused, and a declared schedule cannot be deleted this way (its workers would
store it again)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    Schedule,
    WorkerId,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument, InvalidState, ScheduleExists, ScheduleNotFound
from runifold_sync.store import TaskState
from runifold_sync.worker import schedule_ticker
from runifold_sync.worker.schedule_ticker import ScheduleTicks
from tests.support.backends import contract_backend
from tests.support.clock import Clock
from tests.support.schedules import report_registry

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

HOUR = timedelta(hours=1)
DECLARED = Schedule("declared", "report", 1, every=HOUR)
NIGHTLY = Schedule("nightly", "report", 1, every=HOUR, input={"kind": "late"}, queue="reports")


def _move_to(store: WorkflowStore, clock: Clock, moment: datetime) -> None:
    clock.advance(moment - store.now())


def test_a_created_schedule_is_ticked_by_workers_serving_it_until_deleted(
    store: WorkflowStore, clock: Clock
) -> None:
    serving = ScheduleTicks(store, report_registry(DECLARED))  # a registry declaring another
    elsewhere = ScheduleTicks(store, WorkflowRegistry())  # a registry without report v1
    serving.run()
    elsewhere.run()
    record = store.create_schedule(NIGHTLY, actor="app", reason="customer asked")
    assert (record.origin, record.queue, record.expression, record.last_tick) == (
        "created",
        "reports",
        "every 1h",
        None,
    )
    assert store.created_schedules() == [NIGHTLY]
    assert {s.name: s.origin for s in store.schedules()} == {"declared": "declared", "nightly": "created"}
    h1 = NIGHTLY.times.next_after(record.active_since)
    assert serving.run().next_due == h1  # picked up at the next pass: no new ticker
    _move_to(store, clock, h1 + timedelta(minutes=1))
    assert elsewhere.run().created == ()  # it cannot make report's tasks
    created = serving.run().created
    assert NIGHTLY.task_id(h1) in created
    task = store.get_task(NIGHTLY.task_id(h1))
    assert (task.queue, task.input["input"]) == ("reports", {"kind": "late"})
    assert serving.run().created == ()  # once

    deleted = store.delete_schedule("nightly", actor="app", reason="customer left")
    assert deleted.last_tick == h1
    assert store.created_schedules() == []
    _move_to(store, clock, h1 + 3 * HOUR)
    assert not any(c.startswith("schedule:nightly:") for c in serving.run().created)
    assert store.get_task(NIGHTLY.task_id(h1)).state is TaskState.QUEUED  # created ticks stay
    history = [(e.kind, e.actor, e.reason) for e in store.schedule_history("nightly")]
    assert history == [("created", "app", "customer asked"), ("deleted", "app", "customer left")]


def test_names_taken_and_declared_schedules_are_refused(store: WorkflowStore) -> None:
    ScheduleTicks(store, report_registry(DECLARED)).run()
    store.create_schedule(NIGHTLY)
    with pytest.raises(ScheduleExists, match="'nightly' is already stored"):
        store.create_schedule(NIGHTLY)
    with pytest.raises(ScheduleExists, match="'declared' is already stored"):
        store.create_schedule(Schedule("declared", "report", 1, every=HOUR))
    with pytest.raises(InvalidState, match="'declared' is declared by a registry"):
        store.delete_schedule("declared")
    assert store.schedule("declared").origin == "declared"
    with pytest.raises(ScheduleNotFound):
        store.delete_schedule("nobody")
    with pytest.raises(InvalidArgument, match="^schedule must be a Schedule, got 'nightly'$"):
        store.create_schedule("nightly")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="actor must be non-empty"):
        store.delete_schedule("nightly", actor=" ")
    # Deleted, the name is free again.
    store.delete_schedule("nightly")
    assert store.create_schedule(NIGHTLY).origin == "created"


def test_a_running_worker_picks_up_a_schedule_created_after_it_started(
    store: WorkflowStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_ticker, "CREATED_LOOK_S", 0.1)
    every = Schedule("every-second", "report", 1, every=timedelta(seconds=1), queue="reports")
    worker = WorkflowWorker(
        store, report_registry(), WorkerId.parse("w"), LeaseDuration(HOUR), timedelta(minutes=1)
    )
    shutdown = CancellationToken()
    thread = threading.Thread(target=worker.run, args=(shutdown,), daemon=True)
    thread.start()
    try:
        store.create_schedule(every)
        deadline = datetime.now().timestamp() + 20
        while datetime.now().timestamp() < deadline:
            if store.list_tasks(queue="reports"):
                break
            threading.Event().wait(0.1)
        ticks = store.list_tasks(queue="reports")
        assert ticks and ticks[0].task_id.startswith("schedule:every-second:")
    finally:
        shutdown.cancel()
        thread.join(10)
        worker.close()
