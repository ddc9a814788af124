"""``store.enqueue(task, connection=conn)`` on every backend: the task is written in the
application's own open transaction (psycopg 3 for PostgreSQL, ``sqlite3`` for SQLite),
so it exists exactly when that transaction commits; a connection to another database,
at another schema version, or with no transaction open is refused before anything is
written."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.errors import EnqueueConflict, InvalidArgument, TaskNotFound
from runifold_sync.store import TaskState
from runifold_sync.store.open import sqlite_path
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend


@contextmanager
def app_connection(backend: Backend, url: str | None = None) -> Iterator[Any]:
    """The application's own connection to the store's database, as its ORM would hold
    one: not in autocommit mode, its own row factory."""
    if backend.kind == "sqlite":
        conn = sqlite3.connect(sqlite_path(url or backend.url))
        try:
            yield conn
        finally:
            conn.close()
    else:
        with psycopg.connect(url or backend.direct_url) as conn:
            yield conn


def _app_write(conn: Any) -> None:
    """The application's own row, in the same transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS app_orders (id INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO app_orders (id) VALUES (7)")


def _task(task_id: str = "order-7") -> WorkflowTask:
    return WorkflowTask.new("orders", 1, {"order": 7}, checkpoint_id=task_id)


def test_a_task_enqueued_in_a_committed_transaction_exists(store: WorkflowStore, backend: Backend) -> None:
    with app_connection(backend) as conn:
        _app_write(conn)
        assert store.enqueue(_task(), connection=conn).created
        with pytest.raises(TaskNotFound):  # not visible to anyone before the commit
            store.get_task("order-7")
        conn.commit()
    assert store.get_task("order-7").state is TaskState.QUEUED
    assert [e.kind for e in store.history("order-7")] == ["enqueued"]


def test_a_task_enqueued_in_a_rolled_back_transaction_does_not_exist(
    store: WorkflowStore, backend: Backend
) -> None:
    with app_connection(backend) as conn:
        _app_write(conn)
        store.enqueue(_task(), connection=conn)
        conn.rollback()
    with pytest.raises(TaskNotFound):
        store.get_task("order-7")
    assert store.history("order-7") == []


def test_enqueue_in_a_transaction_keeps_the_idempotency_rules(store: WorkflowStore, backend: Backend) -> None:
    store.enqueue(_task())
    with app_connection(backend) as conn:
        assert store.enqueue(_task(), connection=conn).created is False
        other = WorkflowTask.new("orders", 1, {"order": 8}, checkpoint_id="order-7")
        with pytest.raises(EnqueueConflict):
            store.enqueue(other, connection=conn)


def test_a_connection_to_another_database_is_refused(
    store: WorkflowStore, backend: Backend, tmp_path: Any
) -> None:
    if backend.kind == "sqlite":
        other = f"sqlite:///{tmp_path / 'other.db'}"
    else:
        parts = urlsplit(backend.direct_url)
        other = urlunsplit(parts._replace(path="/postgres"))
    with app_connection(backend, other) as conn, pytest.raises(InvalidArgument, match="not"):
        store.enqueue(_task(), connection=conn)
    with pytest.raises(TaskNotFound):
        store.get_task("order-7")


def test_a_connection_at_another_schema_version_is_refused(store: WorkflowStore, backend: Backend) -> None:
    with app_connection(backend) as conn:
        conn.execute("DELETE FROM runifold_schema WHERE version = (SELECT MAX(version) FROM runifold_schema)")
        with pytest.raises(InvalidArgument, match="schema version"):
            store.enqueue(_task(), connection=conn)
        conn.rollback()


def test_a_connection_with_no_transaction_open_is_refused(store: WorkflowStore, backend: Backend) -> None:
    if backend.kind == "sqlite":
        conn: Any = sqlite3.connect(sqlite_path(backend.url), isolation_level=None)
    else:
        conn = psycopg.connect(backend.direct_url, autocommit=True)
    with conn, pytest.raises(InvalidArgument, match="no transaction open"):
        store.enqueue(_task(), connection=conn)
    if backend.kind == "sqlite":
        conn.close()


def test_something_that_is_not_a_connection_is_refused(store: WorkflowStore) -> None:
    with pytest.raises(InvalidArgument, match="connection must be"):
        store.enqueue(_task(), connection="postgresql://elsewhere")


def test_a_closed_connection_is_refused_naming_it(store: WorkflowStore, backend: Backend) -> None:
    """Was the driver's own error (sqlite3.ProgrammingError, psycopg.OperationalError)."""
    with app_connection(backend) as conn:
        pass
    with pytest.raises(InvalidArgument, match="connection is closed"):
        store.enqueue(_task(), connection=conn)
    assert store.list_tasks() == []


def test_a_connection_in_a_failed_transaction_is_refused_naming_it(
    store: WorkflowStore, backend: Backend
) -> None:
    """PostgreSQL aborts a transaction at its first error (it was InFailedSqlTransaction);
    SQLite has no such state: its transaction goes on after a failed statement, and the
    task is enqueued in it."""
    if backend.kind == "sqlite":
        with app_connection(backend) as conn:
            _app_write(conn)
            with pytest.raises(sqlite3.OperationalError):
                conn.execute("SELECT * FROM no_such_table")
            store.enqueue(_task(), connection=conn)
            conn.commit()
        assert [t.task_id for t in store.list_tasks()] == ["order-7"]
        return
    with app_connection(backend) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(InvalidArgument, match="failed transaction"):
            store.enqueue(_task(), connection=conn)
        conn.rollback()
    assert store.list_tasks() == []
