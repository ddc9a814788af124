"""PostgreSQL through PgBouncer in transaction mode (``tools/pgbouncer_up``): idle workers
still wake when work comes, on the direct LISTEN connection the URL names or, without
one, by polling, which the store says once. (The store contract suite runs whole on
this backend too, ``contract_backend`` in ``tests/support/backends.py``; the demo and a
pool run go through it in ``test_open_store.py`` and ``test_supervisor.py``.)"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.store import TaskState
from runifold_sync.store.postgres.url import POLL_INTERVAL_S
from tests.support.backends import through_pgbouncer

ENQUEUE_AFTER_S = 0.4


def seconds_until_woken(waiter: WorkflowStore, producer: WorkflowStore) -> float:
    """How long ``waiter.wait_for_work`` (up to 8 s) took after ``producer`` enqueued."""
    timer = threading.Timer(ENQUEUE_AFTER_S, lambda: producer.enqueue(WorkflowTask.new("orders", 1, {})))
    started = time.monotonic()
    timer.start()
    try:
        assert waiter.wait_for_work(timedelta(seconds=8))
    finally:
        timer.join()
    woken_after_s = time.monotonic() - started - ENQUEUE_AFTER_S
    assert woken_after_s > 0  # it waited for the enqueue: nothing was due before
    return woken_after_s


def test_an_idle_wait_behind_a_transaction_pooler_wakes_on_its_direct_listen_connection(
    postgres_url: str,
) -> None:
    url = through_pgbouncer(postgres_url, "transaction")
    assert "listen_port=" in url
    with open_store(url) as waiter, open_store(url) as producer:
        woken_after_s = []
        for _ in range(3):
            woken_after_s.append(seconds_until_woken(waiter, producer))
            for task in producer.list_tasks(state=TaskState.QUEUED):  # nothing due at the next wait
                producer.cancel(task.task_id, actor="test", reason="drained")
        with psycopg.connect(postgres_url) as conn:  # the LISTEN went to the server itself
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query = 'LISTEN runifold_tasks'"
            ).fetchone()
        assert row is not None and row[0] == 1
    # A notification wakes it: well inside the 0.5 s a poll could take.
    assert max(woken_after_s) < 0.3, woken_after_s


def test_without_a_listen_connection_an_idle_wait_polls_and_the_store_says_so_once(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = through_pgbouncer(postgres_url, "transaction").partition("&listen_host")[0]
    caplog.set_level(logging.INFO, logger="runifold_sync.store")
    with open_store(url) as waiter, open_store(url) as producer:
        woken_after_s = seconds_until_woken(waiter, producer)
    said = [r.getMessage() for r in caplog.records if "look for work every" in r.getMessage()]
    assert len(said) == 1, said
    assert f"every {POLL_INTERVAL_S:.1f} s" in said[0] and "listen_host" in said[0]
    assert woken_after_s < POLL_INTERVAL_S + 0.3, woken_after_s
