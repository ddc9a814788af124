"""A cancel that races with the worker's own end of a run (suspend, retry or yield) on
PostgreSQL must still cancel the task.

READ COMMITTED, unlocked: ``cancel`` tried its UPDATEs one after another. The one for a
queued or waiting task saw the row leased and matched nothing; the worker's suspend then
committed; the one for a leased task, re-checking the new row version, found it waiting
and matched nothing either, so an unfinished task was refused as "only an unfinished task
can be cancelled". The cancel now locks the row first. The test makes that interleaving
certain: a second connection moves the task out of ``leased`` with the store's own
statement and holds its transaction open until the cancel is blocked on the row lock.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.store import TaskState
from runifold_sync.store.base import WorkflowStore
from runifold_sync.store.postgres.statements import Q
from tests.support.backends import wait_until_blocked_on_a_lock

NOTE = "cancelled by ops: customer left"


# The worker's end of a run, as the store runs it: (query, its parameters, the state it leaves).
ENDS: dict[str, tuple[str, dict[str, Any], str]] = {
    "suspend": (
        "suspend",
        {"head": "{}", "wake_at": None, "reason": "waiting", "signal": "go", "approval": None, "child": None},
        "waiting",
    ),
    "retry": ("retry", {"head": "{}", "delay": 3600.0, "reason": "again"}, "queued"),
    "yield": ("release", {"delay": 0.0, "reason": "step slice used up; requeued"}, "queued"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("end", sorted(ENDS))
def test_a_cancel_blocked_behind_the_workers_end_of_a_run_cancels_the_task(
    pg: WorkflowStore, postgres_url: str, end: str
) -> None:
    pg.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    [claimed] = pg.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    query, params, left_in = ENDS[end]
    answers: list[TaskState | BaseException] = []

    def cancel() -> None:
        try:
            answers.append(pg.cancel("t1", "ops", "customer left"))
        except BaseException as exc:  # reported by the main thread
            answers.append(exc)

    canceller = threading.Thread(target=cancel)
    with psycopg.connect(postgres_url) as worker_conn:  # one transaction, committed on exit
        moved = worker_conn.execute(
            Q[query],
            params | {"task_id": "t1", "token": claimed.lease.fencing_token, "revision": claimed.revision},
        ).fetchone()
        assert moved is not None
        state = worker_conn.execute("SELECT state FROM runifold_tasks WHERE task_id = 't1'").fetchone()
        assert state == (left_in,)
        canceller.start()
        wait_until_blocked_on_a_lock(postgres_url, "the cancel")  # the cancel waits for this transaction
        assert answers == []
    canceller.join(timeout=30)

    assert answers == [TaskState.CANCELLED]
    task = pg.get_task("t1")
    assert (task.state, task.reason) == (TaskState.CANCELLED, NOTE)
    assert pg.history("t1")[-1].kind == "cancelled"
