"""The store in Django's own database (``RUNIFOLD_DATABASE = "default"``): its URL read
from ``DATABASES``, enqueues written on Django's connection in the current transaction,
and a system check that the store's tables are at this release's schema version.

One database means one transaction: a view that rolls back leaves no task, one that
commits leaves exactly one, and no hook runs after the commit that a crash could skip.
The same goes for a ``@workflow.transaction()`` step: it runs in ``atomic()`` on Django's
connection, so what it writes with the ORM commits with its checkpoint or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any
from urllib.parse import quote

from django.conf import settings  # type: ignore[import-untyped]
from django.core import checks  # type: ignore[import-untyped]
from django.db import DatabaseError, connections, transaction  # type: ignore[import-untyped]

from ...errors import InvalidArgument
from ...store.base import WorkflowStore
from ...store.queries import load_migrations

SETTING = "RUNIFOLD_DATABASE"


def store_alias() -> str | None:
    """The Django database alias the store lives in, or None (``RUNIFOLD_DATABASE_URL``)."""
    alias = getattr(settings, SETTING, None)
    if alias is not None and alias not in settings.DATABASES:
        raise InvalidArgument(
            f"{SETTING} = {alias!r} names no database in DATABASES ({sorted(settings.DATABASES)})"
        )
    return alias


def store_url(alias: str) -> str:
    """The store URL of Django database ``alias`` (SQLite or PostgreSQL)."""
    db: dict[str, Any] = settings.DATABASES[alias]
    engine = db.get("ENGINE", "")
    if engine.endswith("sqlite3"):
        name = str(db["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            # Django's SQLite test database is in memory unless TEST NAME says otherwise:
            # the store's own connections (and a worker's process) cannot open it.
            raise InvalidArgument(
                f"{SETTING} = {alias!r}: database {alias!r} is in memory ({name!r}), which the "
                f"store cannot open; give it a file, in tests with "
                f"DATABASES[{alias!r}]['TEST'] = {{'NAME': 'test-db.sqlite3'}}"
            )
        return f"sqlite:///{os.path.abspath(name)}"
    if engine.endswith("postgresql"):
        user = quote(db.get("USER") or "", safe="")
        password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
        credentials = f"{user}{password}@" if user else ""
        host, port = db.get("HOST") or "localhost", f":{db['PORT']}" if db.get("PORT") else ""
        return f"postgresql://{credentials}{host}{port}/{quote(db['NAME'], safe='')}"
    raise InvalidArgument(f"{SETTING} = {alias!r}: the store runs on SQLite or PostgreSQL, not {engine!r}")


def raw_connection(alias: str) -> Any:
    """Django's driver connection for ``alias`` (sqlite3, or psycopg 3), connected."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    return wrapper.connection


@contextmanager
def atomic_connection(alias: str) -> Iterator[Any]:
    """Django's driver connection for ``alias`` inside ``transaction.atomic(using=alias)``
    (a savepoint when one is open already): what a transaction step runs in, so its ORM
    writes and its checkpoint commit, or roll back, as one."""
    with transaction.atomic(using=alias):
        yield raw_connection(alias)


def transaction_steps_on_django(store: WorkflowStore, alias: str) -> None:
    """Run ``store``'s transaction steps on Django's connection to ``alias`` (the store's
    own database), so a step's body may use the ORM in the step's transaction."""
    store.run_transaction_steps_on(partial(atomic_connection, alias))


def schema_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check`` warns when the store's tables in Django's database are missing
    or behind this release (a worker's start, or ``python -m runifold_sync migrate``,
    brings them up to date)."""
    alias = store_alias()
    if alias is None:
        return []
    dialect = "sqlite" if settings.DATABASES[alias].get("ENGINE", "").endswith("sqlite3") else "postgres"
    latest = load_migrations(dialect)[-1][0]
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT MAX(version) FROM runifold_schema")
            version = cursor.fetchone()[0]
    except DatabaseError:
        version = None
    if version == latest:
        return []
    return [
        checks.Warning(
            f"the runifold_sync tables in database {alias!r} are at schema version {version}, "
            f"this release needs {latest}",
            hint=f"run: python -m runifold_sync migrate --database {store_url(alias).split('@')[-1]!r}"
            " (with your credentials), or start a worker, which migrates",
            id="runifold.W001",
        )
    ]
