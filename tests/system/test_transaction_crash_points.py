"""The crash points around a ``@workflow.transaction()`` step's one commit, on both
stores: a worker process (``tests.system.transaction_app``) SIGKILLed before the
commit leaves neither the step's entry nor its row (the database rolled both back), and
the next worker runs the body again; killed after it, both are there and the body never
runs again. Either way the application's table ends with exactly one row."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runifold_sync import WorkerId, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome
from runifold_sync.store.open import sqlite_path
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.support.journals import entries

from . import crash_app, transaction_app

TASK = "t1"
CASES = {
    # (crash spec, the step's entry after the crash, app rows after the crash, times book ran)
    "before_commit": ("before_commit:book#1", [], 0, 2),
    "after_commit": ("after_commit:book#1", ["book#1"], 1, 1),
}


def _rows(backend: Backend) -> list[tuple[Any, ...]]:
    if backend.kind == "sqlite":
        with sqlite3.connect(sqlite_path(backend.url)) as conn:
            return conn.execute("SELECT task_id FROM app_ledger").fetchall()
    with psycopg.connect(backend.direct_url) as conn:
        return conn.execute("SELECT task_id FROM app_ledger").fetchall()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_transaction_step_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, journal_after, rows_after, book_runs = CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    if backend.kind == "sqlite":
        with sqlite3.connect(sqlite_path(backend.url)) as conn:
            conn.execute(transaction_app.TABLE)
    else:
        with psycopg.connect(backend.direct_url) as conn:
            conn.execute(transaction_app.TABLE)
    store.enqueue(WorkflowTask.new("booking", 1, "order-1", checkpoint_id=TASK))

    env = dict(os.environ, RUNIFOLD_CRASH_AT=spec)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", TASK]
    proc = processes.run("tests.system.transaction_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert [e["call_id"] for e in entries(store, TASK)] == journal_after
    assert len(_rows(backend)) == rows_after
    store.set_clock_offset(crash_app.LEASE.value * 3)  # past the dead worker's lease

    worker = WorkflowWorker(
        store, transaction_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, TASK)
    finally:
        worker.close()
    record = store.get_task(TASK)
    assert (record.outcome, record.result) == (TaskOutcome.COMPLETED, "booked order-1, confirmed"), (
        record.reason
    )
    assert len(_rows(backend)) == 1  # exactly once, whatever the crash
    runs = Counter(line[0] for line in ledger.read(ledger_path))
    assert runs == {"book": book_runs, "confirm": 1}
