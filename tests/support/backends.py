"""The backend fixtures of every test directory (registered by ``tests/conftest.py``):
``sqlite_store`` and ``pg`` for tests of one backend, ``backend`` and ``store`` for tests
that run once per backend.

SQLite: a fresh file in ``tmp_path``. PostgreSQL: a fresh database per test, created
from the server named by ``RUNIFOLD_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``) and dropped afterwards. When that
server cannot be reached the PostgreSQL tests are skipped, except under ``CI``, where
they fail: a backend test that quietly skips is a hole in CI.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import psycopg
import pytest

from runifold_sync import WorkflowStore, open_store
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.sqlite import SqliteWorkflowStore

from .clock import Clock

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", "postgres"]


def admin_url() -> str:
    return os.environ.get("RUNIFOLD_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL


def with_database(url: str, dbname: str) -> str:
    return urlsplit(url)._replace(path=f"/{dbname}").geturl()


@attrs.define
class Backend:
    """One fresh database; ``open()`` gives another store (another "process") on it."""

    name: str
    url: str
    opened: list[WorkflowStore] = attrs.Factory(list)

    def open(self) -> WorkflowStore:
        store = open_store(self.url)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The server's URL once it answered; skips (or fails under CI) when it does not."""
    url = admin_url()
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        message = f"PostgreSQL at {urlsplit(url).hostname}:{urlsplit(url).port} is unreachable: {exc}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so PostgreSQL tests must run)")
        pytest.skip(f"{message}; start it or set RUNIFOLD_TEST_POSTGRES_URL")
    return url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """URL of a fresh, empty database, dropped (connections terminated) afterwards."""
    dbname = f"runifold_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield with_database(postgres_admin_url, dbname)
    finally:
        with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'workflows.db'}"  # tmp_path is absolute: four slashes
    else:
        url = request.getfixturevalue("postgres_url")
    backend = Backend(request.param, url)
    try:
        yield backend
    finally:
        backend.close_all()


@pytest.fixture
def store(backend: Backend) -> WorkflowStore:
    return backend.open()


@pytest.fixture
def clock(store: WorkflowStore) -> Clock:
    """The shared clock of ``store`` (``tests/unit/conftest.py`` puts it on ``sqlite_store``)."""
    return Clock(store)


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "workflows.db"


@pytest.fixture
def sqlite_store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    """A SQLite store on a fresh file, for tests of that backend alone."""
    store = SqliteWorkflowStore.open(sqlite_path)
    yield store
    store.close()


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresWorkflowStore]:
    """A PostgreSQL store on a fresh database, for tests of that backend alone."""
    store = PostgresWorkflowStore.connect(postgres_url, max_size=4)
    yield store
    store.close()


def wait_until_blocked_on_a_lock(url: str, what: str, timeout_s: float = 20.0) -> None:
    """Return once some session of the database at ``url`` waits on a lock: the call a
    race test started in another thread has reached the row the test holds."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"{what} never blocked on the task row")
