"""The pytest plugin of the testing kit, loaded through the ``pytest11`` entry point
``runifold`` wherever runifold_sync is installed (``-p no:runifold`` turns it off).

It adds two fixtures, named ``runifold_*`` so that they clash with no project's own
``store`` or ``clock``:

- ``runifold_store``: a fresh store per test, closed after it. A SQLite file in
  ``tmp_path`` by default; when ``RUNIFOLD_TEST_DATABASE_URL`` names a PostgreSQL
  server (``postgresql://user@host:5432/postgres``, a user that may create databases),
  a new database on it, dropped after the test (its connections terminated), named
  ``runifold_kit_`` and a random suffix, or with the prefix ``RUNIFOLD_TEST_DB_PREFIX``
  sets (on a server shared with others, the names a project may create there).
- ``runifold_clock``: that store's :class:`~runifold_sync.testing.StoreClock`.

pytest imports every installed plugin at startup, in every project of the environment,
so this module imports nothing at module level but pytest: the store (and PostgreSQL's
driver, only when the variable asks for it) is imported by the fixture that opens it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from ..model import validate

if TYPE_CHECKING:
    from ..store.base import WorkflowStore
    from .clock import StoreClock

DATABASE_URL_VARIABLE = "RUNIFOLD_TEST_DATABASE_URL"
# Databases this plugin creates are named so, so a leftover one is recognisable.
DATABASE_PREFIX = "runifold_kit_"
DATABASE_PREFIX_VARIABLE = "RUNIFOLD_TEST_DB_PREFIX"
# A prefix is a lowercase SQL identifier's start, short enough that the 16 random
# characters after it (and a word or two a test adds) stay within PostgreSQL's 63.
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,39}")


def database_prefix(default: str) -> str:
    """The prefix of the names of the databases a test run creates: the value of
    ``RUNIFOLD_TEST_DB_PREFIX`` when it is set, else ``default``. The project's own test
    suite takes it from here too."""
    from ..errors import InvalidArgument

    prefix = os.environ.get(DATABASE_PREFIX_VARIABLE)
    if prefix is None:
        return default
    if not _PREFIX.fullmatch(prefix):
        raise InvalidArgument(
            f"{DATABASE_PREFIX_VARIABLE} must be 1 to 40 lowercase letters, digits and underscores, "
            f"not starting with a digit, got {validate.shown(prefix)}"
        )
    return prefix


@pytest.fixture
def runifold_store(tmp_path: Path) -> Iterator[WorkflowStore]:
    """A fresh, migrated store for this test (see the module docstring for which)."""
    from ..store.open import open_store

    server = os.environ.get(DATABASE_URL_VARIABLE)
    if not server:
        store = open_store(f"sqlite:///{tmp_path / 'runifold.db'}")
        try:
            yield store
        finally:
            store.close()
        return
    with _fresh_database(server) as url:
        store = open_store(url)
        try:
            yield store
        finally:
            store.close()


@pytest.fixture
def runifold_clock(runifold_store: WorkflowStore) -> StoreClock:
    """The shared store clock of ``runifold_store``, to move store time by hand."""
    from .clock import StoreClock

    return StoreClock(runifold_store)


@contextmanager
def _fresh_database(server_url: str) -> Iterator[str]:
    """The URL of a new database on the PostgreSQL server at ``server_url``, dropped
    after the block (``WITH (FORCE)``: a connection the test leaked does not keep it)."""
    import psycopg
    from psycopg import sql

    from ..errors import InvalidArgument
    from ..model.redaction import redacted

    parts = urlsplit(server_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidArgument(
            f"{DATABASE_URL_VARIABLE} must be a postgresql:// URL of a server, got {redacted(server_url)!r}"
        )
    name = f"{database_prefix(DATABASE_PREFIX)}{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield parts._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
