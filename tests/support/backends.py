"""The backend fixtures of every test directory (registered by ``tests/conftest.py``):
``sqlite_store`` and ``pg`` for tests of one backend, ``backend`` and ``store`` for tests
that run once per backend.

SQLite: a fresh file in ``tmp_path``. PostgreSQL: an empty database per test, on the
server named by ``RUNIFOLD_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``), emptied afterwards for the next test
(``DatabasePool``). PgBouncer
(``pgbouncer``, the store contract suite's third backend): the same fresh database
through the transaction-pooling PgBouncer at ``RUNIFOLD_TEST_PGBOUNCER_URL`` (default
port 6432; ``tools/pgbouncer_up`` starts it, and a session-pooling one on 6433,
``RUNIFOLD_TEST_PGBOUNCER_SESSION_URL``), LISTENing straight to the server. When a
server cannot be reached its tests are skipped, except under ``CI``, where they fail: a
backend test that quietly skips is a hole in CI.
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
from psycopg import sql

from runifold_sync import WorkflowStore, open_store
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.sqlite import SqliteWorkflowStore

from .clock import Clock

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_PGBOUNCER_URLS = {
    "transaction": "postgresql://postgres@127.0.0.1:6432/postgres",
    "session": "postgresql://postgres@127.0.0.1:6433/postgres",
}
BACKENDS = ["sqlite", "postgres"]
CONTRACT_BACKENDS = [*BACKENDS, "pgbouncer"]


def admin_url() -> str:
    return os.environ.get("RUNIFOLD_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL


def with_database(url: str, dbname: str) -> str:
    return urlsplit(url)._replace(path=f"/{dbname}").geturl()


@attrs.define
class Backend:
    """One fresh database; ``open()`` gives another store (another "process") on it.
    ``kind`` is its dialect (``sqlite`` or ``postgres``, PgBouncer's too), ``direct_url``
    the database itself for a test's own reads (not through a pooler)."""

    name: str
    url: str
    direct_url: str
    opened: list[WorkflowStore] = attrs.Factory(list)

    @property
    def kind(self) -> str:
        return "sqlite" if self.name == "sqlite" else "postgres"

    def open(self) -> WorkflowStore:
        store = open_store(self.url)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def reachable(url: str, what: str, variable: str) -> str:
    """``url`` once it answered; skips (or fails under CI) when it does not."""
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        message = f"{what} at {urlsplit(url).hostname}:{urlsplit(url).port} is unreachable: {exc}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so its tests must run)")
        pytest.skip(f"{message}; start it or set {variable}")
    return url


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The server's URL once it answered."""
    return reachable(admin_url(), "PostgreSQL", "RUNIFOLD_TEST_POSTGRES_URL")


def pgbouncer_admin_url(mode: str) -> str:
    """The PgBouncer pooling in ``mode`` (transaction or session) once it answered."""
    variable = (
        "RUNIFOLD_TEST_PGBOUNCER_URL" if mode == "transaction" else "RUNIFOLD_TEST_PGBOUNCER_SESSION_URL"
    )
    url = os.environ.get(variable) or DEFAULT_PGBOUNCER_URLS[mode]
    return reachable(url, f"PgBouncer ({mode} pooling; tools/pgbouncer_up starts it)", variable)


def through_pgbouncer(direct_url: str, mode: str) -> str:
    """``direct_url``'s database through the PgBouncer pooling in ``mode``; in transaction
    mode with ``pgbouncer=true`` and LISTEN straight to the server."""
    pooled = urlsplit(pgbouncer_admin_url(mode))
    url = urlsplit(direct_url)._replace(netloc=pooled.netloc).geturl()
    if mode == "session":
        return url
    server = urlsplit(direct_url)
    return f"{url}?pgbouncer=true&listen_host={server.hostname}&listen_port={server.port}"


@attrs.define
class DatabasePool:
    """This test process's PostgreSQL databases, each lent to one test at a time and
    emptied when it comes back, dropped at the end of the session. A database per test
    was the suite's largest cost: ``DROP DATABASE`` makes the server take an immediate
    checkpoint (every dirty buffer written and fsynced, one checkpoint at a time for the
    whole server), so the parallel workers queued behind a thousand checkpoints, and
    ``CREATE DATABASE`` wrote the template's 7 MB through the WAL each time."""

    admin_url: str
    free: list[str] = attrs.Factory(list)
    made: list[str] = attrs.Factory(list)

    def take(self) -> str:
        if self.free:
            return self.free.pop()
        dbname = f"runifold_test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        self.made.append(dbname)
        return dbname

    def give_back(self, dbname: str) -> None:
        """Empty ``dbname`` as a new database is (no schema objects, no per-database
        settings) and lend it again; one that cannot be emptied is dropped."""
        try:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute(sql.SQL("ALTER DATABASE {} RESET ALL").format(sql.Identifier(dbname)))
            with psycopg.connect(with_database(self.admin_url, dbname), autocommit=True) as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(
                    "DROP SCHEMA public CASCADE; CREATE SCHEMA public AUTHORIZATION pg_database_owner;"
                    " GRANT USAGE ON SCHEMA public TO PUBLIC"
                )
                left = conn.execute(
                    "SELECT count(*) FROM pg_namespace WHERE nspname NOT IN ('public', 'information_schema')"
                    " AND nspname NOT LIKE 'pg\\_%'"
                ).fetchone()
        except psycopg.Error:
            self.drop(dbname)
            return
        if left is not None and left[0]:
            self.drop(dbname)  # a test made a schema of its own
            return
        self.free.append(dbname)

    def drop(self, dbname: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        self.made.remove(dbname)
        if dbname in self.free:
            self.free.remove(dbname)

    def drop_all(self) -> None:
        for dbname in list(self.made):
            self.drop(dbname)


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[DatabasePool]:
    """The pool on the suite's server (``RUNIFOLD_TEST_POSTGRES_URL``)."""
    pool = DatabasePool(admin_url())
    yield pool
    pool.drop_all()


@pytest.fixture
def postgres_url(postgres_admin_url: str, postgres_databases: DatabasePool) -> Iterator[str]:
    """URL of an empty database of this test's own, emptied again afterwards; on a
    private cluster a test overrides ``postgres_admin_url`` with, dropped afterwards."""
    shared = postgres_admin_url == postgres_databases.admin_url
    pool = postgres_databases if shared else DatabasePool(postgres_admin_url)
    dbname = pool.take()
    try:
        yield with_database(postgres_admin_url, dbname)
    finally:
        if shared:
            pool.give_back(dbname)
        else:
            pool.drop(dbname)


def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The backend ``request.param`` names, closed at the end of the test."""
    if request.param == "sqlite":
        url = direct = f"sqlite:///{tmp_path / 'workflows.db'}"  # tmp_path is absolute: four slashes
    else:
        url = direct = request.getfixturevalue("postgres_url")
        if request.param == "pgbouncer":
            url = through_pgbouncer(direct, "transaction")
    backend = Backend(request.param, url, direct)
    try:
        yield backend
    finally:
        backend.close_all()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from open_backend(request, tmp_path)


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
