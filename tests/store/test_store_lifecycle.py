"""Store lifecycle on both backends: migrations, waiting for work, closing, fork safety."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument, StoreUnavailable, StoreUsedAcrossFork
from runifold_sync.model.codec import to_json
from runifold_sync.store.open import sqlite_path
from runifold_sync.store.queries import load_migrations
from tests.support import spawned
from tests.support.backends import Backend, contract_backend, suite_database_prefix, with_database
from tests.support.spawned import open_and_migrate

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
LATEST = load_migrations("sqlite")[-1][0]


def task(task_id: str = "t1", **options: Any) -> WorkflowTask:
    return WorkflowTask.new("orders", 1, {"order_id": task_id}, checkpoint_id=task_id, **options)


SCHEMA_SQL = {
    "sqlite": "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name",
    "postgres": (
        "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
    ),
}


# --- migrations ---------------------------------------------------------------------


def test_a_fresh_database_is_migrated_through_every_version_once(backend: Backend) -> None:
    store = backend.open()
    every = [(version,) for version, _script in load_migrations(backend.kind)]
    assert backend.query("SELECT version FROM runifold_schema ORDER BY version") == every
    assert every[-1] == (LATEST,)
    assert store.migrate() == LATEST


def test_migrating_a_migrated_database_again_changes_nothing(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(task())
    schema = backend.query(SCHEMA_SQL[backend.kind])
    versions = backend.query("SELECT version, applied_at FROM runifold_schema")
    assert store.migrate() == LATEST
    assert backend.open().migrate() == LATEST
    assert backend.query(SCHEMA_SQL[backend.kind]) == schema
    assert backend.query("SELECT version, applied_at FROM runifold_schema") == versions
    assert store.get_task("t1").input == {"order_id": "t1"}
    assert [e.kind for e in store.history("t1")] == ["enqueued"]


def test_stores_opened_at_once_on_a_fresh_database_migrate_it_exactly_once(backend: Backend) -> None:
    barrier = threading.Barrier(6)

    def open_after_barrier() -> WorkflowStore:
        barrier.wait()
        return backend.open()

    with ThreadPoolExecutor(6) as pool:
        stores = list(pool.map(lambda _: open_after_barrier(), range(6)))
    assert [s.migrate() for s in stores] == [LATEST] * 6
    every = [(version,) for version, _script in load_migrations(backend.kind)]
    assert backend.query("SELECT version FROM runifold_schema ORDER BY version") == every


@pytest.mark.timeout(120)
def test_processes_started_at_once_on_a_fresh_database_migrate_it_exactly_once(backend: Backend) -> None:
    context = spawned.context()
    barrier, results = context.Barrier(6), context.Queue()
    processes = [
        context.Process(target=open_and_migrate, args=(backend.url, barrier, results)) for _ in range(6)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=90) for _ in processes]  # drain before join
    for process in processes:
        process.join(timeout=30)
    assert reports == [("migrated", LATEST)] * 6
    assert [process.exitcode for process in processes] == [0] * 6
    every = [(version,) for version, _script in load_migrations(backend.kind)]
    assert backend.query("SELECT version FROM runifold_schema ORDER BY version") == every


def test_a_database_migrated_by_a_newer_version_is_refused(backend: Backend) -> None:
    from runifold_sync.errors import SchemaTooNew

    store = backend.open()
    if backend.kind == "sqlite":
        with sqlite3.connect(sqlite_path(backend.url)) as conn:
            conn.execute("INSERT INTO runifold_schema VALUES (99, datetime('now'))")
    else:
        with psycopg.connect(backend.direct_url, autocommit=True) as pg:
            pg.execute("INSERT INTO runifold_schema (version) VALUES (99)")
    with pytest.raises(SchemaTooNew, match="99"):
        store.migrate()


# --- waiting for work ---------------------------------------------------------------


def timed_wait(store: WorkflowStore, timeout_s: float) -> tuple[bool, float]:
    started = time.monotonic()
    found = store.wait_for_work(timedelta(seconds=timeout_s))
    return found, time.monotonic() - started


def test_wait_for_work_returns_at_once_when_a_task_is_claimable(store: WorkflowStore) -> None:
    store.enqueue(task())
    found, elapsed_s = timed_wait(store, 10)
    assert found and elapsed_s < 1


def test_wait_for_work_returns_false_after_the_timeout_when_nothing_is_due(store: WorkflowStore) -> None:
    store.enqueue(task(not_before=store.now() + timedelta(hours=1)))
    found, elapsed_s = timed_wait(store, 0.4)
    assert not found and 0.35 <= elapsed_s < 3
    found, elapsed_s = timed_wait(store, 0)
    assert not found and elapsed_s < 1


def test_wait_for_work_wakes_when_another_store_enqueues(backend: Backend) -> None:
    waiter, producer = backend.open(), backend.open()
    timer = threading.Timer(0.4, lambda: producer.enqueue(task()))
    timer.start()
    try:
        found, elapsed_s = timed_wait(waiter, 15)
    finally:
        timer.join()
    assert found and 0.35 <= elapsed_s < 5


def test_wait_for_work_is_not_satisfied_by_work_that_is_not_due(backend: Backend) -> None:
    waiter, producer = backend.open(), backend.open()
    later = producer.now() + timedelta(hours=1)
    timer = threading.Timer(0.2, lambda: producer.enqueue(task(not_before=later)))
    timer.start()
    try:
        found, elapsed_s = timed_wait(waiter, 1.0)
    finally:
        timer.join()
    assert not found and elapsed_s >= 0.95


def test_wait_for_work_wakes_when_a_timer_comes_due(store: WorkflowStore) -> None:
    store.enqueue(task())
    lease = store.claim(W1, LEASE)[0].lease
    store.suspend(lease, 0, to_json({}), wake_at=store.now() + timedelta(seconds=0.6), reason="timer")
    found, elapsed_s = timed_wait(store, 15)
    assert found and 0.5 <= elapsed_s < 5
    assert store.claim(W1, LEASE)[0].lease.task_id == "t1"


def test_wait_for_work_wakes_when_a_lease_expires(store: WorkflowStore) -> None:
    store.enqueue(task())
    store.claim(W1, LeaseDuration(timedelta(seconds=0.6)))
    found, elapsed_s = timed_wait(store, 15)
    assert found and 0.5 <= elapsed_s < 5


@pytest.mark.parametrize("timeout", [timedelta(seconds=-1), 5, None])
def test_wait_for_work_refuses_a_timeout_that_is_not_a_non_negative_timedelta(
    store: WorkflowStore, timeout: Any
) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        store.wait_for_work(timeout)


# --- closing and forking ------------------------------------------------------------


def test_close_is_idempotent_and_a_closed_store_is_unavailable(backend: Backend) -> None:
    with backend.open() as store:
        store.enqueue(task())
    with pytest.raises(StoreUnavailable, match="closed"):  # leaving the block closed it
        store.get_task("t1")
    store.close()  # closing again is harmless
    with pytest.raises(StoreUnavailable, match="closed"):
        store.get_task("t1")
    assert backend.open().get_task("t1").task_id == "t1"


def test_a_store_used_in_a_forked_child_refuses_with_a_fork_message(store: WorkflowStore) -> None:
    store.enqueue(task())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 2
        try:
            store.get_task("t1")
        except StoreUsedAcrossFork as exc:
            os.write(write, str(exc).encode())
            code = 0
        except BaseException as exc:  # report anything else to the parent
            os.write(write, repr(exc).encode())
        finally:
            store.close()  # must not touch the parent's connections
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert "fork" in message and str(pid) in message
    # A programming error, not an outage the worker and supervisor would retry forever.
    assert not issubclass(StoreUsedAcrossFork, StoreUnavailable)
    assert store.get_task("t1").task_id == "t1"  # the parent's store still works


def _fresh_schema(backend: Backend, request: pytest.FixtureRequest) -> list[tuple[Any, ...]]:
    """The schema of a second, freshly created database of the same backend."""
    if backend.kind == "sqlite":
        url = backend.url.replace("workflows.db", "fresh.db")
        other = Backend("sqlite", url, url)
    else:
        admin = request.getfixturevalue("postgres_admin_url")
        dbname = f"{suite_database_prefix()}fresh_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"'.encode())
        request.addfinalizer(lambda: _drop(admin, dbname))
        other = Backend("postgres", with_database(admin, dbname), with_database(admin, dbname))
    try:
        other.open()
        return other.query(SCHEMA_SQL[backend.kind])
    finally:
        other.close_all()


def _drop(admin: str, dbname: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'.encode())


def test_a_database_at_version_1_with_tasks_migrates_to_the_fresh_schema_keeping_them(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    (_version, first), *_later = load_migrations(backend.kind)
    insert = (
        "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
        "priority, state, ready_at, created_at, updated_at) VALUES "
        "('old', 'orders', 1, 'default', '{\"order_id\":\"old\"}', 0, 'queued', 0, 0, 0)"
    )
    if backend.kind == "sqlite":
        with sqlite3.connect(sqlite_path(backend.url)) as conn:
            conn.executescript(first)
            conn.execute(
                "CREATE TABLE runifold_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
            )
            conn.execute("INSERT INTO runifold_schema VALUES (1, datetime('now'))")
            conn.execute(insert)
    else:
        with psycopg.connect(backend.direct_url) as pg:
            pg.execute(first.encode())
            pg.execute(
                b"CREATE TABLE runifold_schema (version INTEGER PRIMARY KEY, "
                b"applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            )
            pg.execute(b"INSERT INTO runifold_schema (version) VALUES (1)")
            pg.execute(
                b"INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
                b"input_text, priority, state, ready_at, created_at, updated_at) VALUES ('old', 'orders', 1, "
                b"'default', '{\"order_id\": \"old\"}', '{\"order_id\":\"old\"}', 0, 'queued', "
                b"'1970-01-01Z', '1970-01-01Z', '1970-01-01Z')"
            )
    store = backend.open()
    assert backend.query(SCHEMA_SQL[backend.kind]) == _fresh_schema(backend, request)
    assert store.get_task("old").input == {"order_id": "old"}
    assert store.claim(WorkerId.parse("w"), LeaseDuration(timedelta(seconds=30)))[0].lease.task_id == "old"
