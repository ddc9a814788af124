"""The SQLite file's schema: the numbered migrations applied in one write transaction,
and the read that tells when there is nothing to apply.

Opening a store migrates it, and most opens find the file current. Those only read, so
they need no write lock: a store opened while another connection holds one (a Django
request that already wrote, with the store in Django's database) opens at once instead
of waiting for that transaction, which may be waiting for the open.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

from ..queries import pending_migrations
from . import clock as sqlite_clock


def current_version(conn: sqlite3.Connection, path: str) -> int | None:
    """The schema version when the file needs no write to open (every migration applied,
    the clock anchored to this boot), else None. Read in autocommit mode, which in WAL
    mode waits for no writer. A file newer than this release raises ``SchemaTooNew``."""
    try:
        found = conn.execute("SELECT MAX(version) FROM runifold_schema").fetchone()[0] or 0
        anchored = conn.execute("SELECT boot_id FROM runifold_clock WHERE id = 1").fetchone()
    except sqlite3.OperationalError:
        return None  # no tables yet: the write path makes them
    latest, pending = pending_migrations("sqlite", found, f"database {path!r}")
    if pending or anchored is None or anchored[0] != sqlite_clock.HOST_CLOCK.boot_id:
        return None
    return latest


def migrate_in(conn: sqlite3.Connection, path: str) -> int:
    """Inside the caller's ``BEGIN IMMEDIATE``: apply the pending migrations and anchor the
    store clock to this boot if it is not yet (``sqlite_clock``); the schema version."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS runifold_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    current = conn.execute("SELECT MAX(version) FROM runifold_schema").fetchone()[0] or 0
    latest, pending = pending_migrations("sqlite", current, f"database {path!r}")
    for version, script in pending:
        for statement in migration_statements(script):
            conn.execute(statement)
        conn.execute("INSERT INTO runifold_schema VALUES (?, datetime('now'))", (version,))
    sqlite_clock.anchor(conn, time.time_ns() // 1000)
    return latest


def migration_statements(script: str) -> Iterator[str]:
    """Split a migration script into complete statements (sqlite3 runs one at a time)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip():
                yield pending
            pending = ""
    if pending.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in pending.splitlines()
    ):
        raise RuntimeError(f"incomplete statement at end of migration: {pending!r}")
