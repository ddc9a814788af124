"""An audit of every write the store accepted to the tasks and journal tables of a chaos
database.

Checkpoint commits and heartbeats write no history event, so the history alone cannot
show a stale owner's commit that got through. The chaos tool therefore installs, in its
own throwaway database only, triggers that copy each accepted (committed) write:

- ``chaos_writes``, from each update of ``runifold_tasks``: the task, its fencing token
  before and after (a claim raises it), its revision before and after, its state, the
  store's time of the write (the store's own time expression) and, when the revision
  changed, the head written;
- ``chaos_journal_writes``, from each journal row written (inserted, or rewritten when
  an unfinished entry moved on): the task, the entry, the store time, and the task's
  fencing token when it was written, which is the newest grant (fenced writes never
  change the token, and a claim cannot come between: the write holds the task row).

The newest journal entries travel in the head (its ``journal_tail``) and move into rows
in batches, so an entry is first committed either in a head or in a row.

Rolled-back writes leave no row. ``write_id`` orders the writes of one task as they were
accepted: SQLite has one writer at a time, and on PostgreSQL a second update of a row
waits for the first one's transaction to end.

A row does not name its writer. What names the writer is the entry: every chaos body
returns the fencing token it ran under, so an entry carries its writer's token, and an
entry first committed while a newer token was granted is a stale write (see
``chaos_check._stale_writes``); a later move from a tail into a row is not a commit.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import attrs

from runifold_sync.store.postgres.statements import NOW as POSTGRES_NOW
from runifold_sync.store.sqlite.clock import NOW as SQLITE_NOW

_COLUMNS = "write_id, task_id, old_token, token, old_revision, revision, state, at, head"
_VALUES = (
    "NEW.task_id, OLD.fencing_token, NEW.fencing_token, OLD.revision, NEW.revision, NEW.state, {now}, "
    "CASE WHEN NEW.revision <> OLD.revision THEN NEW.head END"
)
_JOURNAL_COLUMNS = "write_id, task_id, token, at, entry"
_JOURNAL_INSERT = (
    "INSERT INTO chaos_journal_writes (task_id, token, at, entry) VALUES (NEW.task_id, "
    "(SELECT t.fencing_token FROM runifold_tasks t WHERE t.task_id = NEW.task_id), {now}, NEW.entry)"
)
_SQLITE = f"""
CREATE TABLE IF NOT EXISTS chaos_writes (
    write_id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
    old_token INTEGER NOT NULL, token INTEGER NOT NULL,
    old_revision INTEGER NOT NULL, revision INTEGER NOT NULL,
    state TEXT NOT NULL, at INTEGER NOT NULL, head TEXT
);
CREATE TRIGGER IF NOT EXISTS chaos_audit AFTER UPDATE ON runifold_tasks BEGIN
    INSERT INTO chaos_writes ({_COLUMNS.removeprefix("write_id, ")})
    VALUES ({_VALUES.format(now=SQLITE_NOW)});
END;
CREATE TABLE IF NOT EXISTS chaos_journal_writes (
    write_id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, token INTEGER NOT NULL,
    at INTEGER NOT NULL, entry TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS chaos_journal_inserted AFTER INSERT ON runifold_journal BEGIN
    {_JOURNAL_INSERT.format(now=SQLITE_NOW)};
END;
CREATE TRIGGER IF NOT EXISTS chaos_journal_updated AFTER UPDATE ON runifold_journal BEGIN
    {_JOURNAL_INSERT.format(now=SQLITE_NOW)};
END;
"""
_POSTGRES = f"""
CREATE TABLE IF NOT EXISTS chaos_writes (
    write_id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL,
    old_token BIGINT NOT NULL, token BIGINT NOT NULL,
    old_revision BIGINT NOT NULL, revision BIGINT NOT NULL,
    state TEXT NOT NULL, at TIMESTAMPTZ NOT NULL, head TEXT
);
CREATE OR REPLACE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_writes ({_COLUMNS.removeprefix("write_id, ")})
    VALUES ({_VALUES.format(now=POSTGRES_NOW)});
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_audit ON runifold_tasks;
CREATE TRIGGER chaos_audit AFTER UPDATE ON runifold_tasks FOR EACH ROW EXECUTE FUNCTION chaos_audit();
CREATE TABLE IF NOT EXISTS chaos_journal_writes (
    write_id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL, token BIGINT NOT NULL,
    at TIMESTAMPTZ NOT NULL, entry TEXT NOT NULL
);
CREATE OR REPLACE FUNCTION chaos_journal_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {_JOURNAL_INSERT.format(now=POSTGRES_NOW)};
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_journal_audit ON runifold_journal;
CREATE TRIGGER chaos_journal_audit AFTER INSERT OR UPDATE ON runifold_journal
    FOR EACH ROW EXECUTE FUNCTION chaos_journal_audit();
"""


@attrs.frozen
class Write:
    """One accepted update of a task row."""

    write_id: int
    task_id: str
    old_token: int
    token: int  # the grant in force after the write: raised only by a claim
    old_revision: int
    revision: int
    state: str
    at: float  # store time, epoch seconds
    head: str | None  # written by this update; None when the revision did not change


@attrs.frozen
class JournalWrite:
    """One accepted write of a journal row."""

    write_id: int
    task_id: str
    token: int  # the task's fencing token when it was written: the newest grant
    at: float  # store time, epoch seconds
    entry: str


def install(kind: str, url: str) -> None:
    """Create the audit table and trigger in the chaos database at ``url``, whose schema
    the store has already migrated."""
    if kind == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            conn.executescript(_SQLITE)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as pg:
        pg.execute(_POSTGRES.encode())


def read(kind: str, url: str) -> list[Write]:
    """Every audited write, in the order they were accepted."""
    rows = _select(kind, url, f"SELECT {_COLUMNS} FROM chaos_writes ORDER BY write_id", at=7)
    return [Write(*row) for row in rows]


def read_journal_writes(kind: str, url: str) -> list[JournalWrite]:
    """Every audited journal row write, in the order they were accepted."""
    rows = _select(kind, url, f"SELECT {_JOURNAL_COLUMNS} FROM chaos_journal_writes ORDER BY write_id", at=3)
    return [JournalWrite(*row) for row in rows]


# Completed events written in the same transaction as another task's: the held
# completions of a claim batch (batch.py). A SQLite transaction stamps all
# its events with one store time; PostgreSQL's share the inserting transaction (xmin).
_BATCHED = {
    "sqlite": "SELECT count(*) FROM runifold_events e WHERE e.kind = 'completed' AND EXISTS ("
    "SELECT 1 FROM runifold_events o WHERE o.kind = 'completed' AND o.at = e.at "
    "AND o.worker_id = e.worker_id AND o.task_id <> e.task_id)",
    "postgres": "SELECT count(*) FROM runifold_events WHERE kind = 'completed' AND xmin::text IN ("
    "SELECT xmin::text FROM runifold_events WHERE kind = 'completed' "
    "GROUP BY xmin::text HAVING count(*) > 1)",
}


def completions_committed_together(kind: str, url: str) -> int:
    """How many tasks' completions were committed in one transaction with another's."""
    [(count,)] = _fetch(kind, url, _BATCHED[kind])
    return int(count)


def _select(kind: str, url: str, query: str, *, at: int) -> list[list[Any]]:
    """The rows of ``query``, column ``at`` (store time) as epoch seconds on both stores."""
    rows = _fetch(kind, url, query)
    if kind == "sqlite":
        seconds = [row[at] / 1_000_000 for row in rows]
    else:
        seconds = [row[at].timestamp() for row in rows]
    return [[*row[:at], when, *row[at + 1 :]] for row, when in zip(rows, seconds, strict=True)]


def _fetch(kind: str, url: str, query: str) -> list[Any]:
    """Every row of ``query``, on a connection of its own."""
    if kind == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            return conn.execute(query).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as pg:
        return pg.execute(query.encode()).fetchall()
