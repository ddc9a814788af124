"""Removing a schedule's stored state, on every backend: the row goes, its ticks' tasks
stay, the removal is in its history, a registry that still adds it stores it again from
then; and the rule ``schedules`` flags by: no live worker declares a schedule when every
live worker started after its last declaration or does not serve its workflow version."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from runifold_sync import Schedule, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument, ScheduleNotFound
from runifold_sync.store import TaskState
from runifold_sync.store.schedule_records import TickAttempt
from runifold_sync.store.serving import live_workers, no_live_worker_declares
from runifold_sync.worker.schedule_ticker import ScheduleTicks
from tests.support.backends import contract_backend
from tests.support.clock import Clock
from tests.support.schedules import report_registry

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

HOUR = timedelta(hours=1)
SECOND = timedelta(seconds=1)
HOURLY = Schedule("hourly", "report", 1, every=HOUR)
DAILY = Schedule("daily", "report", 1, cron="0 3 * * *")


def test_removing_a_schedule_deletes_its_row_keeps_its_tick_tasks_and_is_in_its_history(
    store: WorkflowStore, clock: Clock
) -> None:
    ticks = ScheduleTicks(store, report_registry(HOURLY, DAILY))
    ticks.run()
    h1 = HOURLY.times.next_after(store.schedule("hourly").active_since)
    clock.advance(h1 + SECOND - store.now())
    # Run between 02:00 and 03:00 UTC, the daily schedule's 03:00 tick is due with h1.
    (created,) = [task_id for task_id in ticks.run().created if task_id == HOURLY.task_id(h1)]

    removed = store.remove_schedule("hourly", actor="alice", reason="report retired")
    assert (removed.name, removed.last_tick) == ("hourly", h1)
    assert [s.name for s in store.schedules()] == ["daily"]
    with pytest.raises(ScheduleNotFound, match="'hourly'"):
        store.schedule("hourly")
    task = store.get_task(created)
    assert task.state is TaskState.QUEUED  # the tick's task is not the schedule's row
    history = store.schedule_history("hourly")
    assert [(e.kind, e.actor, e.reason) for e in history] == [
        ("declared", None, None),
        ("removed", "alice", "report retired"),
    ]
    assert history[1].detail == {"expression": "every 1h", "last_tick": created.rpartition("hourly:")[2]}

    with pytest.raises(ScheduleNotFound, match="'hourly'"):
        store.remove_schedule("hourly", actor="alice", reason="again")
    with pytest.raises(InvalidArgument):
        store.remove_schedule("daily", actor="", reason="no actor")
    assert [s.name for s in store.schedules()] == ["daily"]


def test_a_registry_that_still_adds_a_removed_schedule_stores_it_again_from_then(
    store: WorkflowStore, clock: Clock
) -> None:
    running = ScheduleTicks(store, report_registry(HOURLY))  # a pool that keeps running with it
    running.run()
    h1 = HOURLY.times.next_after(store.schedule("hourly").active_since)
    store.remove_schedule("hourly", actor="alice", reason="retired")

    clock.advance(h1 + SECOND - store.now())
    assert running.run().created == ()  # stored again at this look, from now: h1 is not run
    again = store.schedule("hourly")
    assert (again.last_tick, again.active_since > h1) == (None, True)
    clock.advance(h1 + HOUR - store.now())
    assert running.run().created == (HOURLY.task_id(h1 + HOUR),)
    kinds = [e.kind for e in store.schedule_history("hourly")]
    assert kinds == ["declared", "removed", "declared"]


def test_no_live_worker_declares_a_schedule_all_of_them_started_after_or_cannot_run(
    store: WorkflowStore, clock: Clock
) -> None:
    def flagged() -> bool:
        return no_live_worker_declares(store.schedule("hourly"), live_workers(store))

    store.declare_schedules([HOURLY])
    assert flagged()  # no live worker at all
    clock.advance(SECOND)
    store.register_worker(WorkerId.parse("with-it"), host="h", pid=1, definitions=[("report", 1)])
    assert flagged()  # started after the last declaration: not from its registry
    first = store.schedule("hourly").declared_at
    clock.advance(SECOND)
    store.declare_schedules([HOURLY])  # that worker's schedule thread declares it
    assert not flagged()
    assert store.schedule("hourly").declared_at >= first + SECOND  # unchanged, still moved
    clock.advance(SECOND)
    store.register_worker(WorkerId.parse("other"), host="h", pid=2, definitions=[("billing", 1)])
    store.worker_stopped(WorkerId.parse("with-it"), 1)
    assert flagged()
    store.register_worker(WorkerId.parse("older"), host="h", pid=3, definitions=[("billing", 1)])
    clock.advance(SECOND)
    store.declare_schedules([HOURLY])
    assert flagged()  # started before, but its registry cannot add a schedule of report v1
    assert [e.kind for e in store.schedule_history("hourly")] == ["declared"]  # nothing changed


def test_a_schedule_removed_between_a_pools_read_and_its_tick_is_stored_again_at_its_next_look(
    store: WorkflowStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = ScheduleTicks(store, report_registry(HOURLY))
    ticks.run()
    h1 = HOURLY.times.next_after(store.schedule("hourly").active_since)
    create_tick = store.create_tick

    def removed_first(name: str, tick: datetime, task: WorkflowTask) -> TickAttempt:
        store.remove_schedule(name, actor="alice", reason="retired")  # an operator, just then
        return create_tick(name, tick, task)

    monkeypatch.setattr(store, "create_tick", removed_first)
    clock.advance(h1 + SECOND - store.now())
    assert ticks.run().created == ()  # the tick's task is not created, and no error
    monkeypatch.undo()
    assert [s.name for s in store.schedules()] == []
    assert ticks.run().created == ()  # stored again, from now
    assert [e.kind for e in store.schedule_history("hourly")] == ["declared", "removed", "declared"]
    assert store.list_tasks() == []
