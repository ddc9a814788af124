"""The test databases lent by ``tests/support/backends.py`` come back as empty as a new
database: every other PostgreSQL test relies on it."""

from __future__ import annotations

import psycopg
from psycopg import sql

from tests.support.backends import DatabasePool, with_database


def _read(url: str, query: str) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return row[0] if row else None


def test_a_database_given_back_is_lent_again_without_tables_rows_or_settings(postgres_admin_url: str) -> None:
    pool = DatabasePool(postgres_admin_url)
    try:
        first = pool.take()
        url = with_database(postgres_admin_url, first)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE left_behind (id bigserial PRIMARY KEY, note text)")
            conn.execute("INSERT INTO left_behind (note) VALUES ('from the last test')")
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET statement_timeout = '7s'").format(sql.Identifier(first))
            )
        pool.give_back(first)

        again = pool.take()
        assert again == first
        assert _read(url, "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace") == 0
        assert _read(url, "SHOW statement_timeout") == "0"
        assert _read(url, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'public'") == (
            "pg_database_owner"
        )
    finally:
        pool.drop_all()
    assert _read(postgres_admin_url, f"SELECT count(*) FROM pg_database WHERE datname = '{first}'") == 0


def test_a_database_with_a_schema_of_a_tests_own_is_dropped_not_lent_again(postgres_admin_url: str) -> None:
    pool = DatabasePool(postgres_admin_url)
    try:
        first = pool.take()
        with psycopg.connect(with_database(postgres_admin_url, first), autocommit=True) as conn:
            conn.execute("CREATE SCHEMA elsewhere")
        pool.give_back(first)
        assert pool.made == []
        assert pool.take() != first
    finally:
        pool.drop_all()
