"""A signal delivered while its task's worker is suspending to wait for it must wake the
task (the lost-wakeup race found by ``tools/chaos.py --store postgres --tasks 60 --kills 8
--stops 2 --seed 11``: a task left ``waiting for signal 'go'`` with that signal pending).

PostgreSQL, READ COMMITTED: ``send_signal`` locks the task row, inserts the signal and
wakes the task only if it is already ``waiting``. A ``suspend`` statement that starts
while that transaction holds the row lock blocks on the lock; when it resumes it
re-checks its WHERE clause on the new row version, but its ``EXISTS (pending signal)``
sub-query still reads the statement's snapshot, taken before the signal committed. So
neither side sees the other: the task waits with ``ready_at = NULL`` for a signal that
is already there. The test makes that interleaving certain: the delivery's transaction
pauses (before its commit) until the suspend is blocked on the row lock.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

import runifold_sync.store.postgres.store as pg_store
from runifold_sync import LeaseDuration, WorkerId, WorkflowTask, open_store
from runifold_sync.store import TaskState
from runifold_sync.store.base import WorkflowStore
from runifold_sync.store.dialect import Event
from tests.support.backends import wait_until_blocked_on_a_lock


@pytest.mark.timeout(60)
def test_signal_delivered_while_the_worker_suspends_for_it_wakes_the_task(
    pg: WorkflowStore, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg.enqueue(WorkflowTask.new("flow", 1, {}, checkpoint_id="t1"))
    [claimed] = pg.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    lease = claimed.lease
    suspender = open_store(postgres_url)
    errors: list[BaseException] = []

    def suspend() -> None:
        try:
            suspender.suspend(
                lease, claimed.revision, '{"cp": 1}', wake_at=None, reason="waiting", signal="go"
            )
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=suspend)
    original = pg_store.insert_event  # as the store module calls it

    def event_then_let_the_suspend_block(conn: Any, event: Event) -> None:
        original(conn, event)
        if event.kind == "signal_received":  # the delivery holds the row lock and has not committed
            thread.start()
            wait_until_blocked_on_a_lock(postgres_url, "the suspend")

    monkeypatch.setattr(pg_store, "insert_event", event_then_let_the_suspend_block)
    pg.send_signal("t1", "go", {"ok": True}, signal_id="s1", sender="test")
    thread.join(30)
    suspender.close()
    assert not errors, errors

    record = pg.get_task("t1")
    assert record.state is TaskState.WAITING
    assert [s.signal_id for s in pg.pending_signals("t1", "go")] == ["s1"]
    assert record.ready_at is not None, "the task waits for a signal that is already pending"
    assert [
        c.lease.task_id for c in pg.claim(WorkerId.parse("w2"), LeaseDuration(timedelta(seconds=30)))
    ] == ["t1"]
