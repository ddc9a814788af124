"""Enqueue in the caller's PostgreSQL transaction (``store.enqueue(task, connection=conn)``).

The application's own psycopg 3 connection, inside a transaction it will commit or roll
back: the task's rows and its NOTIFY ride that transaction, so the task exists, and
workers wake, exactly when the application's own writes commit. The connection is
checked to reach this store's database (same server, started at the same moment, same
database) at the schema version this code knows; its settings are not changed.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from ...errors import InvalidArgument
from ...model import validate

# What names one database of one running server, and its schema version.
IDENTITY = (
    "SELECT current_database() AS database, current_setting('port') AS port, "
    "pg_postmaster_start_time() AS started, "
    "(SELECT MAX(version) FROM runifold_schema) AS version"
)


class DictRows:
    """The caller's connection as the store's statements use it: rows as dicts, whatever
    ``row_factory`` the application set."""

    __slots__ = ("connection",)

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor[dict[str, Any]]:
        return self.connection.cursor(row_factory=dict_row).execute(query, params)


def checked(connection: object, store: dict[str, Any], where: str) -> DictRows:
    """``connection`` checked against ``store`` (the :data:`IDENTITY` row of the store's
    own database)."""
    if not isinstance(connection, psycopg.Connection):
        raise InvalidArgument(
            f"connection must be a psycopg 3 connection to {where} for a PostgreSQL store, "
            f"got {validate.shown(connection)}"
        )
    status = connection.info.transaction_status
    if connection.closed or status == TransactionStatus.UNKNOWN:
        raise InvalidArgument(
            "connection is closed (or its server connection was lost): enqueue on an open "
            "connection, inside the transaction that is to commit the task"
        )
    if status == TransactionStatus.INERROR:
        raise InvalidArgument(
            "connection is in a failed transaction (an earlier statement of it raised): "
            "nothing more can be written in it; roll it back and enqueue in a new one"
        )
    if connection.autocommit and status != TransactionStatus.INTRANS:
        raise InvalidArgument(
            "connection is in autocommit mode with no transaction open: the task would be "
            "committed at once; enqueue inside `with connection.transaction():`"
        )
    rows = DictRows(connection)
    try:
        found = rows.execute(IDENTITY).fetchone()
    except psycopg.errors.UndefinedTable as exc:
        raise InvalidArgument(f"connection's database has no runifold schema; it is not {where}") from exc
    assert found is not None
    theirs = {k: found[k] for k in ("database", "port", "started")}
    ours = {k: store[k] for k in ("database", "port", "started")}
    if theirs != ours:
        raise InvalidArgument(
            f"connection is to {theirs['database']!r} on another server or database, not {where}"
        )
    if found["version"] != store["version"]:
        raise InvalidArgument(
            f"the database of connection is at schema version {found['version']}, not {store['version']}"
        )
    return rows
