"""The SQLite store waits for the database lock itself, in short random pauses, so a
write held up by another connection's transaction goes through as soon as it ends, and
one held up past the busy timeout fails with the lock named."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.errors import StoreUnavailable
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.sqlite.clock import HOST_CLOCK


@contextmanager
def lock_held_for(path: Path, seconds: float) -> Iterator[None]:
    """Another connection holds the write lock (BEGIN IMMEDIATE) for ``seconds``."""
    locked = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(5)
    try:
        yield
    finally:
        thread.join()


def test_a_write_waits_out_another_connections_transaction(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with SqliteWorkflowStore.open(path) as store:
        with lock_held_for(path, 0.3):
            started = time.monotonic()
            store.enqueue(WorkflowTask.new("orders", 1, {"n": 1}, checkpoint_id="waited"))
            waited_s = time.monotonic() - started
        assert 0.25 <= waited_s < 2.0
        assert store.get_task("waited").task_id == "waited"


def test_a_write_held_up_past_the_busy_timeout_is_unavailable_naming_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with SqliteWorkflowStore.open(path, busy_timeout=timedelta(milliseconds=200)) as store:
        with lock_held_for(path, 1.0):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="database is locked"):
                store.enqueue(WorkflowTask.new("orders", 1, {"n": 1}, checkpoint_id="refused"))
            gave_up_after_s = time.monotonic() - started
        assert 0.2 <= gave_up_after_s < 0.9
        assert store.list_tasks() == []  # nothing half-written


def test_a_busy_timeout_of_zero_fails_at_once_when_the_lock_is_held(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with SqliteWorkflowStore.open(path, busy_timeout=timedelta(0)) as store:
        with lock_held_for(path, 0.5):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="database is locked"):
                store.enqueue(WorkflowTask.new("orders", 1, {"n": 1}, checkpoint_id="refused"))
            assert time.monotonic() - started < 0.1


def test_opening_a_current_file_takes_no_write_lock(tmp_path: Path) -> None:
    """A Django request that has written (its transaction holds the lock) can still open
    the store in the same database: the open only reads when there is nothing to migrate."""
    path = tmp_path / "store.db"
    SqliteWorkflowStore.open(path).close()
    with lock_held_for(path, 1.0):
        started = time.monotonic()
        with SqliteWorkflowStore.open(path, busy_timeout=timedelta(0)) as store:
            assert store.list_tasks() == []
        assert time.monotonic() - started < 0.5


def test_opening_a_file_anchored_to_another_boot_takes_the_lock_to_anchor_it_again(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SqliteWorkflowStore.open(path).close()
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("UPDATE runifold_clock SET boot_id = 'a-boot-before-this-one' WHERE id = 1")
    with lock_held_for(path, 0.5):
        with pytest.raises(StoreUnavailable, match="database is locked"):
            SqliteWorkflowStore.open(path, busy_timeout=timedelta(0))
    SqliteWorkflowStore.open(path).close()
    with sqlite3.connect(path, isolation_level=None) as conn:
        (boot_id,) = conn.execute("SELECT boot_id FROM runifold_clock WHERE id = 1").fetchone()
    assert boot_id == HOST_CLOCK.boot_id


def test_opening_a_file_one_migration_behind_takes_the_lock_to_migrate_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SqliteWorkflowStore.open(path).close()
    with sqlite3.connect(path, isolation_level=None) as conn:
        (latest,) = conn.execute("SELECT MAX(version) FROM runifold_schema").fetchone()
        conn.execute("DELETE FROM runifold_schema WHERE version = ?", (latest,))
    with lock_held_for(path, 0.5):
        with pytest.raises(StoreUnavailable, match="database is locked"):
            SqliteWorkflowStore.open(path, busy_timeout=timedelta(0))
