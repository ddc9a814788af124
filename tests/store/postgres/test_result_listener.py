"""PostgreSQL's waits for a task (``wait_for_task``, ``get_event``) share one LISTEN
connection per store (``store/pglisten.py``), whatever the number of waiting threads;
it goes straight to the server behind a transaction pooler and is absent without a
``listen_host``, where waits poll. A task's end is notified only once a waiter marked it
awaited, and a waiter whose mark waits for a completion holding the row still sees the
end. A terminated connection is replaced without losing a finish; a forked child cannot
use it and leaves it to the parent; ``close`` ends it.
(The waits themselves are in the contract suite, ``tests/store/test_wait_for_task.py``.)
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, open_store
from runifold_sync.errors import StoreUsedAcrossFork, WaitTimedOut
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store import TaskOutcome
from runifold_sync.store.postgres.listen import ResultListener
from tests.support.backends import through_pgbouncer, wait_until_blocked_on_a_lock

LEASE = LeaseDuration(timedelta(seconds=30))
LISTENING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND query = 'LISTEN runifold_results'"
)


def listening_sessions(postgres_url: str) -> int:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(LISTENING).fetchone()
    assert row is not None
    return int(row[0])


def listener_of(store: WorkflowStore) -> ResultListener:
    assert isinstance(store, PostgresWorkflowStore)
    listener = store.dialect.results
    assert listener is not None
    return listener


def complete_all(store: WorkflowStore, count: int) -> None:
    for _ in range(count):
        [claimed] = store.claim(WorkerId.parse("w1"), LEASE)
        store.complete(claimed.lease, claimed.revision, "{}", '"done"')


def wait_all(store: WorkflowStore, ids: list[str]) -> tuple[list[threading.Thread], dict[str, object]]:
    returned: dict[str, object] = {}

    def wait(task_id: str) -> None:
        returned[task_id] = store.wait_for_task(task_id, timedelta(seconds=30)).outcome

    threads = [threading.Thread(target=wait, args=(task_id,), daemon=True) for task_id in ids]
    for thread in threads:
        thread.start()
    return threads, returned


def awaited(postgres_url: str) -> list[str]:
    """The tasks a waiter has marked awaited (the ones whose end is notified)."""
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT task_id FROM runifold_tasks WHERE result_awaited ORDER BY task_id")
        return [row[0] for row in rows]


def until(predicate: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("through", ["server", "pgbouncer"])
def test_twenty_waiting_threads_share_one_listen_connection(postgres_url: str, through: str) -> None:
    url = postgres_url if through == "server" else through_pgbouncer(postgres_url, "transaction")
    ids = [f"t{n}" for n in range(20)]
    with open_store(url) as waiting, open_store(url) as worker:
        for task_id in ids:
            waiting.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id=task_id))
        assert listening_sessions(postgres_url) == 0  # opened at the first wait, not before
        threads, returned = wait_all(waiting, ids)
        until(lambda: listener_of(waiting).watches == len(ids), "every thread subscribed")
        # Counted on the server itself: behind PgBouncer, the direct listen_host connection.
        assert listening_sessions(postgres_url) == 1
        assert listener_of(waiting).connects == 1
        complete_all(worker, len(ids))
        for thread in threads:
            thread.join(timeout=10)
        assert returned == dict.fromkeys(ids, TaskOutcome.COMPLETED)
        assert listener_of(waiting).watches == 0  # each wait let go of its subscription
    until(lambda: listening_sessions(postgres_url) == 0, "close ended the LISTEN connection")


def test_behind_a_transaction_pooler_without_listen_host_a_wait_polls(postgres_url: str) -> None:
    url = through_pgbouncer(postgres_url, "transaction").split("&listen_host=")[0]
    with open_store(url) as waiting, open_store(url) as worker:
        assert isinstance(waiting, PostgresWorkflowStore) and waiting.dialect.results is None
        waiting.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
        threads, returned = wait_all(waiting, ["t1"])
        time.sleep(0.2)
        complete_all(worker, 1)
        done_at = time.monotonic()
        threads[0].join(timeout=10)
        assert returned == {"t1": TaskOutcome.COMPLETED}
        assert time.monotonic() - done_at < 0.75  # within a poll interval (0.5 s)
        assert listening_sessions(postgres_url) == 0


def test_a_terminated_listen_connection_is_replaced_and_no_finish_is_lost(postgres_url: str) -> None:
    with open_store(postgres_url) as waiting, open_store(postgres_url) as worker:
        for task_id in ("t1", "t2"):
            waiting.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id=task_id))
        threads, returned = wait_all(waiting, ["t1"])
        until(lambda: listening_sessions(postgres_url) == 1, "the wait listens")
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query = 'LISTEN runifold_results'"
            )
        complete_all(worker, 1)  # may land while nothing listens: the waiter looks again
        threads[0].join(timeout=10)
        assert returned == {"t1": TaskOutcome.COMPLETED}
        until(lambda: listening_sessions(postgres_url) == 1, "a new connection listens")
        assert listener_of(waiting).connects == 2
        threads, returned = wait_all(waiting, ["t2"])
        time.sleep(0.2)
        complete_all(worker, 1)
        threads[0].join(timeout=10)
        assert returned == {"t2": TaskOutcome.COMPLETED}


def test_a_forked_child_cannot_wait_on_the_parents_listener_and_leaves_it_working(
    postgres_url: str,
) -> None:
    with open_store(postgres_url) as store, open_store(postgres_url) as worker:
        store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
        with pytest.raises(WaitTimedOut):  # the listener is open and its thread runs
            store.wait_for_task("t1", timedelta(milliseconds=100))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            code = 2
            try:
                listener_of(store).listening()
            except StoreUsedAcrossFork as exc:
                os.write(write, str(exc).encode())
                code = 0
            except BaseException as exc:
                os.write(write, repr(exc).encode())
            finally:
                store.close()  # must leave the parent's connection and thread alone
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            message = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, message
        assert "fork" in message and str(pid) in message
        threads, returned = wait_all(store, ["t1"])
        time.sleep(0.2)
        complete_all(worker, 1)
        threads[0].join(timeout=10)
        assert returned == {"t1": TaskOutcome.COMPLETED}
        assert listener_of(store).connects == 1


def test_only_the_end_of_a_task_someone_waits_for_is_notified(postgres_url: str) -> None:
    with (
        open_store(postgres_url) as waiting,
        open_store(postgres_url) as worker,
        psycopg.connect(postgres_url, autocommit=True) as listening,
    ):
        listening.execute("LISTEN runifold_results")
        for task_id in ("unwatched", "awaited"):
            waiting.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id=task_id))
        threads, returned = wait_all(waiting, ["awaited"])
        until(lambda: awaited(postgres_url) == ["awaited"], "the waiter marked its task")
        complete_all(worker, 2)
        threads[0].join(timeout=10)
        assert returned == {"awaited": TaskOutcome.COMPLETED}
        heard = [notify.payload for notify in listening.notifies(timeout=1.0, stop_after=5)]
        assert heard == ["awaited"]


def test_a_waiter_marking_a_task_a_completion_holds_sees_it_end_without_a_notification(
    postgres_url: str,
) -> None:
    with open_store(postgres_url) as waiting, psycopg.connect(postgres_url) as completing:
        waiting.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
        completing.execute("SELECT 1 FROM runifold_tasks WHERE task_id = 't1' FOR UPDATE")
        threads, returned = wait_all(waiting, ["t1"])
        wait_until_blocked_on_a_lock(postgres_url, "the waiter's mark")
        # Ended as a completion that read the row before the mark would: no NOTIFY.
        completing.execute(
            "UPDATE runifold_tasks SET state = 'terminal', outcome = 'completed', ready_at = NULL, "
            "result = '1' WHERE task_id = 't1'"
        )
        completing.commit()
        threads[0].join(timeout=10)
        assert returned == {"t1": TaskOutcome.COMPLETED}
