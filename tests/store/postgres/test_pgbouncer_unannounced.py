"""A transaction-pooling PgBouncer (``tools/pgbouncer_up``, 127.0.0.1:6432) the URL does
not announce with ``pgbouncer=true``: psycopg prepares a statement it has run five times
on one connection, and PgBouncer runs the next transaction on another server connection,
which lacks it. That driver error (``InvalidSqlStatementName: prepared statement "_pg3_3"
does not exist``) becomes :class:`StoreMisconfigured`, saying what happened and to add
``pgbouncer=true``."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest

from runifold_sync import open_store
from runifold_sync.errors import StoreMisconfigured, StoreNotWritable
from runifold_sync.postgres import PostgresWorkflowStore
from tests.support.backends import pgbouncer_admin_url


def _through_pgbouncer(direct_url: str, query: str = "") -> str:
    """``direct_url``'s database through the transaction-pooling PgBouncer, as given."""
    pooled = urlsplit(pgbouncer_admin_url("transaction"))
    return urlsplit(direct_url)._replace(netloc=pooled.netloc, query=query).geturl()


def _prepare_then_move(store: PostgresWorkflowStore, url: str) -> None:
    """Run one statement until psycopg prepares it, then hold the PgBouncer server
    connection it ran on in another client's transaction, so the store's next
    transaction runs on a server connection of its own: without the statement."""
    for _ in range(8):
        store.list_tasks()
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT 1")  # PgBouncer hands this client the server connection just used
        store.list_tasks()


def test_a_transaction_pooler_the_url_does_not_announce_is_named_with_the_fix(postgres_url: str) -> None:
    url = _through_pgbouncer(postgres_url)
    open_store(postgres_url).close()  # migrated straight on the server: only the move is tested
    store = PostgresWorkflowStore.connect(url, min_size=1, max_size=1, migrate=False)
    try:
        with pytest.raises(StoreMisconfigured) as raised:
            _prepare_then_move(store, url)
    finally:
        store.close()
    message = str(raised.value)
    assert 'InvalidSqlStatementName: prepared statement "_pg3_' in message
    assert "a transaction-pooling PgBouncer (or another transaction pooler) is between" in message
    assert "Add pgbouncer=true to the store URL" in message
    assert isinstance(raised.value, StoreNotWritable)  # an operator must act: workers stop on it


def test_with_pgbouncer_true_the_same_sequence_runs(postgres_url: str) -> None:
    open_store(postgres_url).close()
    url = _through_pgbouncer(postgres_url, "pgbouncer=true")
    store = PostgresWorkflowStore.connect(url, min_size=1, max_size=1, migrate=False)
    try:
        _prepare_then_move(store, url.partition("?")[0])
    finally:
        store.close()
