"""The crash-point cases of a schedule's tick: a worker process
(``tests.system.schedule_app``) killed (SIGKILL) by its schedule thread just before
and just after the transaction that creates a due tick's task and records the tick, on
every backend; then a look and a worker in this process finish the job:

- killed before it, nothing of the tick is stored: the next look creates it;
- killed after it, the task and ``last_tick`` are both stored (one transaction): the next
  look creates nothing.

Either way the tick has exactly one task, enqueued once and run once: none lost, none
doubled.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from runifold_sync import WorkerId, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.worker.schedule_ticker import ScheduleTicks
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.support.clock import Clock

from . import crash_app, schedule_app


@attrs.frozen
class TickCase:
    crash: str  # RUNIFOLD_CRASH_AT of the worker process
    stored: bool  # the tick's task and last_tick were stored when it died


SCHEDULE_CASES = {
    "before_tick": TickCase("before_tick:hourly", stored=False),
    "after_tick": TickCase("after_tick:hourly", stored=True),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(SCHEDULE_CASES))
def test_schedule_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = SCHEDULE_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(schedule_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    clock = Clock(store)
    registry = schedule_app.registry()
    store.declare_schedules(registry.schedules)
    (hourly,) = [s for s in registry.schedules if s.name == "hourly"]
    tick = hourly.times.next_after(store.schedule("hourly").active_since)
    clock.advance(tick + timedelta(minutes=1) - store.now())  # the hour's tick is due

    env = dict(os.environ, RUNIFOLD_CRASH_AT=case.crash)
    proc = processes.run("tests.system.schedule_app", "--url", backend.url, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {case.crash} reached" in proc.stderr, proc.stderr

    hourly_tasks = [
        t.task_id for t in store.list_tasks(definition="ticked") if t.task_id.startswith("schedule:hourly:")
    ]
    assert hourly_tasks == ([hourly.task_id(tick)] if case.stored else [])
    assert store.schedule("hourly").last_tick == (tick if case.stored else None)

    clock.advance(crash_app.LEASE.value * 3)  # past any lease the dead worker held
    created = ScheduleTicks(store, registry).run().created
    assert [c for c in created if c.startswith("schedule:hourly:")] == (
        [] if case.stored else [hourly.task_id(tick)]
    )
    worker = WorkflowWorker(store, registry, WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT)
    try:
        crash_app.drive(worker, hourly.task_id(tick))
    finally:
        worker.close()
    record = store.get_task(hourly.task_id(tick))
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), record.reason
    assert [e.kind for e in store.history(record.task_id)].count("enqueued") == 1
    assert [
        t.task_id for t in store.list_tasks(definition="ticked", limit=1000) if "hourly" in t.task_id
    ] == [record.task_id]
    runs = [line for line in ledger.read(ledger_path) if line[0] == "hourly"]
    assert [line[2] for line in runs] == [record.task_id]  # its body ran once
