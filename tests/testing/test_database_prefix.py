"""``RUNIFOLD_TEST_DB_PREFIX`` names the databases a test run creates on a shared
PostgreSQL server: the testing kit's (``runifold_store``) and this suite's own
(``DatabasePool``); a prefix that is no identifier's start is refused naming it."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from runifold_sync.errors import InvalidArgument
from runifold_sync.testing.plugin import DATABASE_PREFIX, _fresh_database, database_prefix
from tests.support.backends import DatabasePool


def _databases(server: str, prefix: str) -> set[str]:
    with psycopg.connect(server, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (prefix,))
        return {row[0] for row in rows}


@pytest.fixture
def prefix(monkeypatch: pytest.MonkeyPatch) -> str:
    chosen = f"team_{uuid.uuid4().hex[:6]}_"
    monkeypatch.setenv("RUNIFOLD_TEST_DB_PREFIX", chosen)
    return chosen


def test_the_kit_names_its_database_with_the_prefix_and_drops_it(
    postgres_admin_url: str, prefix: str
) -> None:
    with _fresh_database(postgres_admin_url) as url:
        name = url.rsplit("/", 1)[1]
        assert name.startswith(prefix) and len(name) == len(prefix) + 16
        assert _databases(postgres_admin_url, prefix) == {name}
    assert _databases(postgres_admin_url, prefix) == set()


def test_the_suites_databases_carry_the_prefix(postgres_admin_url: str, prefix: str) -> None:
    pool = DatabasePool(postgres_admin_url)
    try:
        name = pool.take()
        assert name.startswith(prefix)
        assert _databases(postgres_admin_url, prefix) == {name}
    finally:
        pool.drop_all()
    assert _databases(postgres_admin_url, prefix) == set()


def test_without_the_variable_each_keeps_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNIFOLD_TEST_DB_PREFIX", raising=False)
    assert database_prefix(DATABASE_PREFIX) == "runifold_kit_"
    assert database_prefix("runifold_test_") == "runifold_test_"


@pytest.mark.parametrize("bad", ["", "Team_", "1team_", "team-a_", "team; DROP", "t" * 41])
def test_a_prefix_that_is_no_identifiers_start_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("RUNIFOLD_TEST_DB_PREFIX", bad)
    with pytest.raises(InvalidArgument, match=r"^RUNIFOLD_TEST_DB_PREFIX must be 1 to 40 lowercase") as info:
        database_prefix(DATABASE_PREFIX)
    assert str(info.value).endswith(f"got {bad!r}")
