"""A child's enqueue (``store.enqueue_child``) commits without waiting for the disk; the
parent's next commit, which waits, makes it durable with its own, since the server
flushes its log in order. Proven on this test process's private cluster
(``private_postgres``), stopped in immediate mode as a crash stops it (no shutdown
checkpoint; the log not yet flushed is lost) and started again."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from runifold_sync import WorkflowTask, open_store
from runifold_sync.store import TaskState
from tests.support.pgcluster import PrivateCluster


@pytest.fixture
def postgres_admin_url(private_postgres: PrivateCluster) -> str:
    """The test database (``postgres_url``) lives on the private cluster."""
    return private_postgres.admin_url


@pytest.fixture
def cluster(private_postgres: PrivateCluster, postgres_url: str) -> Iterator[PrivateCluster]:
    """The server behind ``postgres_url``, left running whatever the test did."""
    try:
        yield private_postgres
    finally:
        private_postgres.ensure_running()


def test_a_waited_commit_after_a_child_enqueue_keeps_the_child_through_a_crash(
    cluster: PrivateCluster, postgres_url: str
) -> None:
    with open_store(postgres_url) as store:
        store.enqueue_child(WorkflowTask.new("kid", 1, 1, checkpoint_id="kid-1"))
        store.enqueue(WorkflowTask.new("parent-commit", 1, 1, checkpoint_id="after"))
    cluster.crash()
    cluster.ensure_running()
    with open_store(postgres_url) as store:
        assert store.get_task("kid-1").state is TaskState.QUEUED
        assert store.get_task("after").state is TaskState.QUEUED


def test_a_child_enqueue_leaves_its_connection_waiting_for_the_disk_again(postgres_url: str) -> None:
    """The setting is the transaction's own (SET LOCAL): the pooled connection's next
    transactions wait for their commit's flush as before."""
    with open_store(postgres_url) as store:
        store.enqueue_child(WorkflowTask.new("kid", 1, 1, checkpoint_id="kid-1"))
        with store.dialect.transaction() as tx:
            assert tx.conn.execute("SHOW synchronous_commit").fetchone() == {"synchronous_commit": "on"}
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM runifold_tasks").fetchone() == (1,)
