"""Schedules in the store, on every backend: the state row, ticks created once and only
when due (store time, moved by the tests' clock), only the latest tick after downtime,
pause and resume (audited), and two stores racing for one tick."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from runifold_sync import LeaseDuration, Schedule, WorkerId, WorkflowRegistry, WorkflowStore, WorkflowWorker
from runifold_sync.errors import InvalidArgument, ScheduleNotFound
from runifold_sync.store import TaskState
from runifold_sync.worker.schedule_ticker import ScheduleTicks
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.schedules import report_registry

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

HOUR = timedelta(hours=1)


HOURLY = Schedule("hourly", "report", 1, every=HOUR, input={"kind": "usage"})


def _move_to(store: WorkflowStore, clock: Clock, moment: datetime) -> None:
    clock.advance(moment - store.now())


def _tick_ids(store: WorkflowStore, name: str) -> list[str]:
    return sorted(
        t.task_id for t in store.list_tasks(limit=1000) if t.task_id.startswith(f"schedule:{name}:")
    )


def test_ticks_are_made_once_when_due_and_only_the_latest_after_downtime(
    store: WorkflowStore, clock: Clock
) -> None:
    ticks = ScheduleTicks(store, report_registry(HOURLY))
    first = ticks.run()
    declared = store.schedule("hourly")
    assert (declared.last_tick, declared.paused, declared.expression) == (None, False, "every 1h")
    assert first.created == ()  # nothing from before the schedule existed
    h1 = HOURLY.times.next_after(declared.active_since)
    assert first.next_due == h1

    _move_to(store, clock, h1 + timedelta(minutes=10))
    assert ticks.run().created == ("schedule:hourly:" + h1.strftime("%Y-%m-%dT%H:%M:%SZ"),)
    assert ticks.run().created == ()
    # Five hours with no worker running: one tick, the latest, not five in a row.
    _move_to(store, clock, h1 + 5 * HOUR + timedelta(minutes=1))
    (created,) = ticks.run().created
    assert created == HOURLY.task_id(h1 + 5 * HOUR)
    assert _tick_ids(store, "hourly") == [HOURLY.task_id(h1), HOURLY.task_id(h1 + 5 * HOUR)]
    assert store.schedule("hourly").last_tick == h1 + 5 * HOUR
    # Another process that had not looked since h1 finds nothing left to do.
    assert ScheduleTicks(store, report_registry(HOURLY)).run().created == ()

    task = store.get_task(created)
    assert (task.definition_name, task.definition_version) == ("report", 1)
    assert task.input == {
        "schedule": "hourly",
        "tick": created.rpartition("hourly:")[2],
        "input": {"kind": "usage"},
    }
    assert [e.kind for e in store.history(created)] == ["enqueued"]
    worker = WorkflowWorker(
        store, report_registry(), WorkerId.parse("w"), LeaseDuration(HOUR), timedelta(minutes=1)
    )
    try:
        assert [worker.run_once().kind for _ in range(3)] == ["completed", "completed", "idle"]
    finally:
        worker.close()
    done = store.get_task(created)
    assert done.state is TaskState.TERMINAL
    assert done.result == {"tick": (h1 + 5 * HOUR).isoformat(), "input": {"kind": "usage"}}


def test_a_paused_schedule_makes_no_tick_and_resumes_from_its_next_tick(
    store: WorkflowStore, clock: Clock
) -> None:
    ticks = ScheduleTicks(store, report_registry(HOURLY))
    ticks.run()
    h1 = HOURLY.times.next_after(store.schedule("hourly").active_since)
    paused = store.pause_schedule("hourly", actor="alice", reason="migrating the warehouse")
    assert (paused.paused, paused.paused_by, paused.paused_reason) == (
        True,
        "alice",
        "migrating the warehouse",
    )
    assert paused.next_tick(store.now()) is None
    _move_to(store, clock, h1 + timedelta(minutes=5))
    assert ticks.run().created == ()
    assert ScheduleTicks(store, report_registry(HOURLY)).run().created == ()  # a fresh process too

    resumed = store.resume_schedule("hourly", actor="bob", reason="warehouse is back")
    assert not resumed.paused and resumed.paused_by is None
    assert ticks.run().created == ()  # h1 fell while paused: not run late
    assert resumed.next_tick(store.now()) == h1 + HOUR
    _move_to(store, clock, h1 + HOUR)
    assert ticks.run().created == (HOURLY.task_id(h1 + HOUR),)
    assert _tick_ids(store, "hourly") == [HOURLY.task_id(h1 + HOUR)]

    history = [(e.kind, e.actor, e.reason) for e in store.schedule_history("hourly")]
    assert history == [
        ("declared", None, None),
        ("paused", "alice", "migrating the warehouse"),
        ("resumed", "bob", "warehouse is back"),
    ]


def test_resuming_a_schedule_that_is_not_paused_changes_nothing_but_is_recorded(store: WorkflowStore) -> None:
    store.declare_schedules([HOURLY])
    before = store.schedule("hourly")
    after = store.resume_schedule("hourly", actor="carol", reason="just in case")
    assert after.active_since == before.active_since
    assert [e.kind for e in store.schedule_history("hourly")] == ["declared", "resumed"]


def test_create_tick_refuses_a_tick_made_already_one_not_due_and_an_unknown_schedule(
    store: WorkflowStore, clock: Clock
) -> None:
    registry = report_registry(HOURLY)
    store.declare_schedules(registry.schedules)
    h1 = HOURLY.times.next_after(store.schedule("hourly").active_since)
    early = store.create_tick("hourly", h1, registry.tick_task(HOURLY, h1))
    assert not early.created and _tick_ids(store, "hourly") == []  # not due before its time
    _move_to(store, clock, h1 + HOUR + timedelta(seconds=1))
    assert store.create_tick("hourly", h1 + HOUR, registry.tick_task(HOURLY, h1 + HOUR)).created
    late = store.create_tick("hourly", h1, registry.tick_task(HOURLY, h1))
    assert not late.created and late.schedule.last_tick == h1 + HOUR  # older than the last
    assert _tick_ids(store, "hourly") == [HOURLY.task_id(h1 + HOUR)]
    nightly = Schedule("nightly", "report", 1, every=HOUR)
    with pytest.raises(ScheduleNotFound, match="no schedule named 'nightly' is stored"):
        store.create_tick("nightly", h1, report_registry(nightly).tick_task(nightly, h1))
    with pytest.raises(InvalidArgument, match="must be task 'schedule:hourly:.*got 'schedule:nightly:"):
        store.create_tick("hourly", h1, report_registry(nightly).tick_task(nightly, h1))
    with pytest.raises(ScheduleNotFound):
        store.pause_schedule("nightly", actor="a", reason="b")
    with pytest.raises(ScheduleNotFound):
        store.schedule("nightly")


def _race(racers: list[WorkflowStore], registry: WorkflowRegistry, tick: datetime) -> list[bool]:
    """Each racer asks for ``tick`` at once, from a thread of its own: who created it."""
    barrier = threading.Barrier(len(racers))
    created: list[bool] = []

    def race(racer: WorkflowStore) -> None:
        barrier.wait()
        created.append(racer.create_tick("hourly", tick, registry.tick_task(HOURLY, tick)).created)

    threads = [threading.Thread(target=race, args=(racer,)) for racer in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return created


def test_two_stores_racing_for_one_tick_create_it_once(
    backend: Backend, store: WorkflowStore, clock: Clock
) -> None:
    registry = report_registry(HOURLY)
    store.declare_schedules(registry.schedules)
    racers = [backend.open(), backend.open()]
    tick = HOURLY.times.next_after(store.schedule("hourly").active_since)
    for _ in range(4):
        _move_to(store, clock, tick + timedelta(seconds=1))
        assert sorted(_race(racers, registry, tick)) == [False, True]
        tick += HOUR
    assert len(_tick_ids(store, "hourly")) == 4


def test_a_changed_definition_replaces_the_stored_one_and_is_in_the_history(store: WorkflowStore) -> None:
    store.declare_schedules([HOURLY])
    store.declare_schedules([HOURLY])  # the same again: nothing to record
    nightly = Schedule("hourly", "report", 1, cron="30 2 * * *", timezone="Europe/Berlin")
    store.declare_schedules([nightly])
    record = store.schedule("hourly")
    assert (record.cron, record.every, record.timezone, record.expression) == (
        "30 2 * * *",
        None,
        "Europe/Berlin",
        "cron 30 2 * * *",
    )
    events = store.schedule_history("hourly")
    assert [e.kind for e in events] == ["declared", "changed"]
    assert events[1].detail["before"]["every_s"] == 3600
    assert events[1].detail["after"]["cron"] == "30 2 * * *"
    assert [r.name for r in store.schedules()] == ["hourly"]
