"""Idle PostgreSQL workers woken by a notification claim about as many at a time as the
work it announces (``pgwait.wait_woken``): every waiter receives it, only the holders of
its wake slots go on at once, and one that found no free slot still takes work that is
due after the grace (a winner that did not claim it)."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store.postgres import wait as pgwait

LEASE = LeaseDuration(timedelta(seconds=30))


@pytest.fixture
def stores(postgres_url: str) -> Iterator[list[PostgresWorkflowStore]]:
    """Four stores on one database, as four idle worker processes hold them."""
    opened = [PostgresWorkflowStore.connect(postgres_url, max_size=3) for _ in range(4)]
    yield opened
    for store in opened:
        store.close()


def _wait_all(
    stores: list[PostgresWorkflowStore], timeout_s: float
) -> tuple[list[threading.Thread], list[str]]:
    """Each store waits in a thread of its own; one that wakes for work claims at once
    and records what it claimed ("" for an empty claim)."""
    claimed: list[str] = []

    def waiter(n: int, store: PostgresWorkflowStore) -> None:
        if store.wait_for_work(timedelta(seconds=timeout_s)):
            got = store.claim(WorkerId.parse(f"w{n}"), LEASE, limit=1)
            claimed.append(got[0].lease.task_id if got else "")

    threads = [threading.Thread(target=waiter, args=(n, s)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    return threads, claimed


def _enqueue_committed(url: str, tasks: list[WorkflowTask], store: PostgresWorkflowStore, hold: bool) -> None:
    """Enqueue ``tasks`` in a transaction of our own; with ``hold``, first take every wake
    slot of its notification from another session, as winners that never claim."""
    with psycopg.connect(url) as conn, psycopg.connect(url, autocommit=True) as winners:
        store.enqueue_many(tasks, connection=conn)
        (txid,) = conn.execute("SELECT txid_current()").fetchone()  # type: ignore[misc]
        if hold:
            key = zlib.crc32(str(txid).encode()) - 2**31
            for slot in range(len(tasks)):
                winners.execute("SELECT pg_advisory_lock(%s, %s)", (key, slot))
        conn.commit()
        time.sleep(2 * pgwait.WAKE_GRACE_S + 0.5)  # the slots held while the waiters look


def test_one_new_task_wakes_one_of_four_idle_workers(
    stores: list[PostgresWorkflowStore], postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgwait, "WAKE_GRACE_S", 2.0)  # the winner claims well within it
    threads, claimed = _wait_all(stores, timeout_s=4.0)
    time.sleep(0.5)  # every waiter listens
    stores[0].enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="only"))
    for thread in threads:
        thread.join()
    assert claimed == ["only"]  # the three others went back to sleep: no empty claim


def test_a_batch_of_two_wakes_two_workers(
    stores: list[PostgresWorkflowStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgwait, "WAKE_GRACE_S", 2.0)
    threads, claimed = _wait_all(stores, timeout_s=4.0)
    time.sleep(0.5)
    stores[0].enqueue_many([WorkflowTask.new("orders", 1, {}, checkpoint_id=f"t{n}") for n in range(2)])
    for thread in threads:
        thread.join()
    assert sorted(claimed) == ["t0", "t1"]


def test_work_still_due_after_the_grace_is_taken_when_its_winners_do_not(
    stores: list[PostgresWorkflowStore], postgres_url: str
) -> None:
    threads, claimed = _wait_all(stores[:1], timeout_s=5.0)
    time.sleep(0.5)
    started = time.monotonic()
    _enqueue_committed(
        postgres_url, [WorkflowTask.new("orders", 1, {}, checkpoint_id="late")], stores[1], True
    )
    threads[0].join()
    assert claimed == ["late"]
    assert time.monotonic() - started >= pgwait.WAKE_GRACE_S


def test_wait_woken_takes_no_slot_at_a_look_of_its_own(stores: list[PostgresWorkflowStore]) -> None:
    stores[0].enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="ready"))
    started = time.monotonic()
    assert all(store.wait_for_work(timedelta(seconds=5)) for store in stores)  # due at the first look
    assert time.monotonic() - started < 2.0
