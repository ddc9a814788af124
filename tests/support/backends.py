"""The backend fixtures of every test directory (registered by ``tests/conftest.py``):
``sqlite_store`` and ``pg`` for tests of one backend, ``backend`` and ``store`` for tests
that run once per backend; ``contract_backend`` and ``sqlite_clock``, which a module takes
as its own ``backend`` or ``clock`` (the store contract suite's modules, the in-process
worker tests on ``sqlite_store``).

SQLite: a fresh file in ``tmp_path``. PostgreSQL: an empty database per test, on the
server named by ``RUNIFOLD_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``), emptied afterwards for the next test
(``DatabasePool``), named with the prefix ``RUNIFOLD_TEST_DB_PREFIX`` sets (default
``runifold_test_``). PgBouncer (``pgbouncer``, the store contract suite's third backend):
the same fresh database through a transaction-pooling PgBouncer, LISTENing straight to
the server; the test process starts its own (``pgbouncer.py``) unless
``RUNIFOLD_TEST_PGBOUNCER_URL`` (and ``RUNIFOLD_TEST_PGBOUNCER_SESSION_URL`` for session
pooling) names one. When a server cannot be reached its tests are skipped, which fails
them under ``CI`` (``ci.py``): a backend test that quietly skips is a hole in CI.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import psycopg
import pytest
from psycopg import sql

from runifold_sync import WorkflowStore, open_store
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.open import sqlite_path as sqlite_file
from runifold_sync.testing.plugin import database_prefix

from .clock import Clock
from .pgbouncer import started_pgbouncer_url

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PGBOUNCER_VARIABLES = {
    "transaction": "RUNIFOLD_TEST_PGBOUNCER_URL",
    "session": "RUNIFOLD_TEST_PGBOUNCER_SESSION_URL",
}
BACKENDS = ["sqlite", "postgres"]
CONTRACT_BACKENDS = [*BACKENDS, "pgbouncer"]


def suite_database_prefix() -> str:
    """How the databases this suite makes are named: ``RUNIFOLD_TEST_DB_PREFIX``, or
    ``runifold_test_``."""
    return database_prefix("runifold_test_")


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

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` read from the database behind the store, as an operator would."""
        if self.kind == "sqlite":
            with closing(sqlite3.connect(sqlite_file(self.url))) as conn:
                return conn.execute(sql).fetchall()
        with psycopg.connect(self.direct_url) as pg:
            return pg.execute(sql.encode()).fetchall()

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def reachable(url: str, what: str, variable: str) -> str:
    """``url`` once it answered; skips when it does not."""
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        where = f"{urlsplit(url).hostname}:{urlsplit(url).port}"
        pytest.skip(f"{what} at {where} is unreachable: {exc}; start it or set {variable}")
    return url


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The server's URL once it answered."""
    return reachable(admin_url(), "PostgreSQL", "RUNIFOLD_TEST_POSTGRES_URL")


def pgbouncer_admin_url(mode: str) -> str:
    """The PgBouncer pooling in ``mode`` (transaction or session): the one its variable
    names once it answered, else this process's own, started on first use."""
    variable = PGBOUNCER_VARIABLES[mode]
    named = os.environ.get(variable)
    if named:
        return reachable(named, f"PgBouncer ({mode} pooling)", variable)
    return started_pgbouncer_url(mode, admin_url())


def through_pgbouncer(direct_url: str, mode: str) -> str:
    """``direct_url``'s database through the PgBouncer pooling in ``mode``; in transaction
    mode with ``pgbouncer=true`` and LISTEN straight to the server."""
    pooled = urlsplit(pgbouncer_admin_url(mode))
    url = urlsplit(direct_url)._replace(netloc=pooled.netloc).geturl()
    if mode == "session":
        return url
    server = urlsplit(direct_url)
    return f"{url}?pgbouncer=true&listen_host={server.hostname}&listen_port={server.port}"


# One line per thing a test could change in a database besides its rows: relations (with
# their options and grants), columns, defaults, indexes, constraints, triggers, views,
# functions, types, other schemas, extensions, per-database settings, and planner
# statistics (a reused table must plan as a new one does). Reused only when it matches
# the fresh migration's, and when the tables have not grown past a small size (the server
# here runs without autovacuum, so deleted rows stay on their pages).
SCHEMA_FINGERPRINT = """
SELECT md5(coalesce(string_agg(line, E'\\n' ORDER BY line), '')) AS fingerprint,
       (SELECT coalesce(sum(pg_relation_size(oid)), 0) FROM pg_class
        WHERE relnamespace = 'public'::regnamespace) AS bytes
FROM (
  SELECT format('rel %s %s %s %s %s', relname, relkind, relpersistence, reloptions, relacl) AS line
    FROM pg_class WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT format('col %s %s %s %s %s %s', attrelid::regclass, attnum, attname,
      format_type(atttypid, atttypmod), attnotnull, attacl)
    FROM pg_attribute JOIN pg_class ON pg_class.oid = attrelid
    WHERE relnamespace = 'public'::regnamespace AND attnum > 0 AND NOT attisdropped
  UNION ALL SELECT format('def %s %s', adrelid::regclass, pg_get_expr(adbin, adrelid))
    FROM pg_attrdef JOIN pg_class ON pg_class.oid = adrelid
    WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT format('idx %s', pg_get_indexdef(indexrelid))
    FROM pg_index JOIN pg_class ON pg_class.oid = indexrelid
    WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT format('con %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT format('trg %s %s', pg_get_triggerdef(oid), tgenabled)
    FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT format('view %s %s', oid::regclass, pg_get_viewdef(oid))
    FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('v', 'm')
  UNION ALL SELECT format('fn %s %s', oid::regprocedure, md5(pg_get_functiondef(oid)))
    FROM pg_proc WHERE pronamespace = 'public'::regnamespace
  UNION ALL SELECT format('type %s %s', typname, typtype)
    FROM pg_type WHERE typnamespace = 'public'::regnamespace AND typrelid = 0
  UNION ALL SELECT format('schema %s %s', nspname, nspacl) FROM pg_namespace
    WHERE nspname NOT IN ('information_schema', 'pg_toast') AND nspname NOT LIKE 'pg\\_%'
  UNION ALL SELECT format('ext %s %s', extname, extversion) FROM pg_extension
  UNION ALL SELECT format('setting %s %s', setrole, setconfig) FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT format('stats %s', starelid::regclass) FROM pg_statistic
    JOIN pg_class ON pg_class.oid = starelid WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT format('analyzed %s %s', relname, reltuples) FROM pg_class
    WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND reltuples <> -1
) AS lines
"""
REUSE_AT_MOST_BYTES = 4 * 1024 * 1024


def schema_fingerprint(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    """The database's ``SCHEMA_FINGERPRINT`` and the bytes its relations take."""
    fingerprint, size = conn.execute(SCHEMA_FINGERPRINT).fetchone() or ("", 0)
    return fingerprint, int(size)


@attrs.frozen
class Pristine:
    """A freshly migrated database as the store leaves it: its fingerprint, size, the rows
    the migrations insert (each table's, as JSON) and its sequences' positions."""

    fingerprint: str
    bytes: int
    tables: tuple[str, ...]
    rows: dict[str, str]
    sequences: dict[str, tuple[int, bool]]

    @classmethod
    def read(cls, conn: psycopg.Connection[Any]) -> Pristine:
        fingerprint, size = schema_fingerprint(conn)
        tables = tuple(
            name
            for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
                " AND relkind = 'r' ORDER BY relname"
            )
        )
        rows = {}
        for table in tables:
            query = sql.SQL("SELECT json_agg(t) FROM {} AS t").format(sql.Identifier(table))
            (contents,) = conn.execute(query).fetchone() or (None,)
            if contents:
                rows[table] = json.dumps(contents)
        sequences = {
            name: (int(value), bool(called))
            for name, value, called in conn.execute(
                "SELECT sequencename, coalesce(last_value, start_value), last_value IS NOT NULL"
                " FROM pg_sequences WHERE schemaname = 'public'"
            )
        }
        return cls(fingerprint, size, tables, rows, sequences)

    def matches(self, conn: psycopg.Connection[Any]) -> bool:
        fingerprint, size = schema_fingerprint(conn)
        return fingerprint == self.fingerprint and size <= self.bytes + REUSE_AT_MOST_BYTES

    def restore(self, conn: psycopg.Connection[Any]) -> None:
        """Put back the migrated rows and nothing else, with triggers and foreign keys off
        (``session_replication_role``, superuser only) so no table's order matters."""
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            for table in self.tables:
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
            for table, contents in self.rows.items():
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {0} OVERRIDING SYSTEM VALUE"
                        " SELECT * FROM json_populate_recordset(NULL::{0}, %s)"
                    ).format(sql.Identifier(table)),
                    (contents,),
                )
            for name, (value, called) in self.sequences.items():
                conn.execute(
                    "SELECT setval(%s, %s, %s)", (sql.Identifier(name).as_string(conn), value, called)
                )
            conn.execute("SELECT pg_stat_reset()")


@attrs.define
class DatabasePool:
    """This test process's PostgreSQL databases, each lent to one test at a time and
    reset when it comes back, dropped at the end of the session. A database per test
    was the suite's largest cost: ``DROP DATABASE`` makes the server take an immediate
    checkpoint (every dirty buffer written and fsynced, one checkpoint at a time for the
    whole server), so the parallel workers queued behind a thousand checkpoints, and
    ``CREATE DATABASE`` wrote the template's 7 MB through the WAL each time.

    A test of a store (``store``, ``pg``) borrows a database already migrated: one that
    comes back still matching a fresh migration (``Pristine``) has its rows put back in
    about 15 ms of server time, where emptying it and migrating again took about 115 ms
    of server and client CPU a test. Anything else is emptied (schema dropped, settings
    reset) and lent as new to a test that wants an empty database."""

    admin_url: str
    free: list[str] = attrs.Factory(list)
    migrated: list[str] = attrs.Factory(list)
    made: list[str] = attrs.Factory(list)
    pristine: Pristine | None = None

    def take(self, *, migrated: bool = False) -> str:
        """A database of this pool: an empty one, or with ``migrated`` one the store's
        migrations have run on (else an empty one the test's store migrates)."""
        if migrated and self.migrated:
            return self.migrated.pop()
        if migrated and self.pristine is None:
            return self.take_pristine()
        if self.free:
            return self.free.pop()
        dbname = f"{suite_database_prefix()}{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        self.made.append(dbname)
        return dbname

    def take_pristine(self) -> str:
        """An empty database migrated here, the state every reused one is put back to."""
        dbname = self.take()
        url = with_database(self.admin_url, dbname)
        PostgresWorkflowStore.connect(url, max_size=1).close()
        with psycopg.connect(url, autocommit=True) as conn:
            self.pristine = Pristine.read(conn)
        return dbname

    def give_back(self, dbname: str) -> None:
        """Reset ``dbname`` to a fresh migration's contents, or else empty it as a new
        database is (no schema objects, no per-database settings), and lend it again; one
        that cannot be emptied is dropped."""
        if self.pristine is not None and self.reset(dbname, self.pristine):
            self.migrated.append(dbname)
        else:
            self.empty(dbname)

    def reset(self, dbname: str, pristine: Pristine) -> bool:
        """Whether ``dbname`` still matched ``pristine`` and has its rows put back; not
        when it changed, or the reset failed (a lock held past the timeout, no superuser)."""
        try:
            with psycopg.connect(with_database(self.admin_url, dbname), autocommit=True) as conn:
                conn.execute("SET lock_timeout = '10s'")
                if not pristine.matches(conn):
                    return False
                pristine.restore(conn)
                return True
        except psycopg.Error:
            return False

    def empty(self, dbname: str) -> None:
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
        for lent in (self.free, self.migrated):
            if dbname in lent:
                lent.remove(dbname)

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
def postgres_url(
    request: pytest.FixtureRequest, postgres_admin_url: str, postgres_databases: DatabasePool
) -> Iterator[str]:
    """URL of a database of this test's own, reset afterwards; on a private cluster a
    test overrides ``postgres_admin_url`` with, dropped afterwards. Empty, unless the
    test opens a store on it (``store``, ``pg``) whose setup would migrate it anyway:
    then already migrated."""
    shared = postgres_admin_url == postgres_databases.admin_url
    pool = postgres_databases if shared else DatabasePool(postgres_admin_url)
    migrated = shared and not {"store", "pg"}.isdisjoint(request.fixturenames)
    dbname = pool.take(migrated=migrated)
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


@pytest.fixture(params=CONTRACT_BACKENDS)
def contract_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """``backend`` of the store contract suite, which runs on a third backend too:
    PostgreSQL through PgBouncer in transaction mode, where nothing may outlive a
    transaction. A module of the suite takes it as its ``backend`` (``backend =
    contract_backend``), and ``store`` and ``clock`` follow."""
    yield from open_backend(request, tmp_path)


@pytest.fixture
def store(backend: Backend) -> WorkflowStore:
    return backend.open()


@pytest.fixture
def clock(store: WorkflowStore) -> Clock:
    """The shared clock of ``store`` (``sqlite_clock`` puts it on ``sqlite_store``)."""
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
def sqlite_clock(sqlite_store: SqliteWorkflowStore) -> Clock:
    """The shared clock of ``sqlite_store``: a module whose in-process worker tests move
    the clock of ``sqlite_store`` takes it as its ``clock`` (``clock = sqlite_clock``)."""
    return Clock(sqlite_store)


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
