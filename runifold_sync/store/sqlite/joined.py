"""Enqueue in the caller's SQLite transaction (``store.enqueue(task, connection=conn)``).

The application's own ``sqlite3`` connection to the store's file, inside a transaction
it will commit or roll back: the task's rows are written there, so the task exists
exactly when the application's own writes do. The connection is checked to be this
store's file at the schema version this code knows, and is given the store-time
function the named queries read (``sqlite_clock.NOW``); nothing else about it changes.
"""

from __future__ import annotations

import os
import sqlite3

from ...errors import InvalidArgument
from ...model import validate
from ..queries import load_migrations
from . import clock as sqlite_clock


def checked(path: str, connection: object) -> sqlite3.Connection:
    """``connection``, checked to be a connection to ``path`` inside a transaction, at
    this code's schema version, and given the store-time function."""
    if not isinstance(connection, sqlite3.Connection):
        raise InvalidArgument(
            f"connection must be a sqlite3.Connection to {path!r} for a SQLite store, "
            f"got {validate.shown(connection)}"
        )
    try:
        autocommit = connection.isolation_level is None and not connection.in_transaction
    except sqlite3.ProgrammingError as exc:  # the only state it refuses to tell: closed
        raise InvalidArgument(
            f"connection is closed ({exc}): enqueue on an open connection, inside the "
            "transaction that is to commit the task"
        ) from None
    if autocommit:
        raise InvalidArgument(
            "connection is in autocommit mode with no transaction open: the task would be "
            "committed at once; run BEGIN first, or use the default isolation_level"
        )
    main = [row[2] for row in connection.execute("PRAGMA database_list").fetchall() if row[1] == "main"]
    if not main or not main[0] or not os.path.exists(main[0]) or not os.path.samefile(main[0], path):
        raise InvalidArgument(
            f"connection is to {main[0] if main else None!r}, not to this store's file {path!r}"
        )
    latest = load_migrations("sqlite")[-1][0]
    try:
        version = connection.execute("SELECT MAX(version) FROM runifold_schema").fetchone()[0]
    except sqlite3.OperationalError:
        version = None
    if version != latest:
        raise InvalidArgument(
            f"the database of connection is at schema version {version}, not {latest}: run migrate"
        )
    connection.create_function("runifold_uptime_us", 0, sqlite_clock.HOST_CLOCK.uptime_us)
    return connection
