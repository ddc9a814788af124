"""Two pools on one store (two ``python -m runifold_sync run`` processes, a supervisor and
its worker each) with an ``every=1s`` schedule for about 8 s, on SQLite and PostgreSQL:
every tick between the first and the last is created exactly once (one task, one
``enqueued`` event, one run of its body), with no gap, whichever pool got there first."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from runifold_sync.store import TaskOutcome, TaskState
from tests.support import ledger, processes
from tests.support.backends import Backend

from . import schedule_app

APP = "tests.system.schedule_app:registry"
RUN_S = 8.0


def _pool(backend: Backend, name: str, ledger_path: Path) -> subprocess.Popen[str]:
    command = ["run", "--app", APP, "--database", backend.url, "--concurrency", "1", "--worker-id", name]
    env = os.environ | {schedule_app.LEDGER_ENV: str(ledger_path)}
    return processes.spawn("runifold_sync", *command, env=env, own_session=True, stdout=subprocess.DEVNULL)


@pytest.mark.timeout(120)
def test_two_pools_create_each_tick_of_an_every_second_schedule_once(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.open()
    store.migrate()
    ledger_path = tmp_path / "ledger.txt"
    with processes.reaped() as started:
        started += [_pool(backend, "pool-a", ledger_path), _pool(backend, "pool-b", ledger_path)]
        processes.wait_until(lambda: len(store.workers()) >= 2, 30, "both pools' workers to register")
        time.sleep(RUN_S)
        for proc in started:
            proc.send_signal(signal.SIGTERM)
        for proc in started:
            assert proc.wait(timeout=30) == 0
    tasks = [t for t in store.list_tasks(limit=1000) if t.task_id.startswith("schedule:every-second:")]
    ticks = sorted(datetime.fromisoformat(t.task_id.rpartition("every-second:")[2]) for t in tasks)
    assert len(ticks) >= RUN_S - 2, [t.task_id for t in tasks]
    steps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert set(steps) == {timedelta(seconds=1)}, ticks  # no duplicate, no gap
    assert store.schedule("every-second").last_tick == ticks[-1]
    for task in tasks:
        assert [e.kind for e in store.history(task.task_id)].count("enqueued") == 1
    # The pools stopped with SIGTERM: a tick created in the last instant may be unrun.
    finished = [t for t in tasks if t.state is TaskState.TERMINAL]
    assert len(finished) >= len(tasks) - 2
    assert all(t.outcome is TaskOutcome.COMPLETED for t in finished)
    runs = [line for line in ledger.read(ledger_path) if line[0] == "every-second"]
    assert sorted(line[2] for line in runs) == sorted({line[2] for line in runs})  # each ran once
    assert {t.task_id for t in finished} <= {line[2] for line in runs}
    assert {int(line[3]) for line in runs} <= {w.pid for w in store.workers()}
