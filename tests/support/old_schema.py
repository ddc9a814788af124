"""A database as an earlier release left it: the migrations up to a version applied by
hand, as that release applied them, so a test can fill it and open the store (which
migrates it the rest of the way)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg

from runifold_sync.store.queries import load_migrations
from runifold_sync.store.sqlite.schema import migration_statements
from tests.support.backends import Backend


class Execute(Protocol):
    def __call__(self, sql: str, params: Sequence[Any] = ...) -> None: ...


@contextmanager
def schema_at(backend: Backend, version: int) -> Iterator[Execute]:
    """``backend``'s database with the migrations up to ``version``; yields a function
    that runs one statement on it (``?`` placeholders on SQLite, ``%s`` on PostgreSQL),
    committed when the block ends."""
    scripts = [(v, script) for v, script in load_migrations(backend.kind) if v <= version]
    assert [v for v, _ in scripts] == list(range(1, version + 1))
    if backend.kind == "sqlite":
        conn = sqlite3.connect(backend.url.removeprefix("sqlite:///"))
        conn.execute("CREATE TABLE runifold_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        for v, script in scripts:
            for statement in migration_statements(script):
                conn.execute(statement)
            conn.execute("INSERT INTO runifold_schema VALUES (?, datetime('now'))", (v,))
        try:
            yield lambda sql, params=(): conn.execute(sql, params) and None
            conn.commit()
        finally:
            conn.close()
        return
    with psycopg.connect(backend.direct_url, autocommit=True) as pg:
        pg.execute(
            "CREATE TABLE runifold_schema "
            "(version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for v, script in scripts:
            pg.execute(script.encode())
            pg.execute("INSERT INTO runifold_schema (version) VALUES (%s)", (v,))
        yield lambda sql, params=(): pg.execute(sql.encode(), params) and None
