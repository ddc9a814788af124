"""Retention on PostgreSQL, where prunes, workers and producers run at once on many
connections: a prune never waits for a row another transaction holds, reads only the
finished tasks' index however large the table, an enqueue whose conflicting task was
pruned between its two statements creates the task, and a pool draining work while a
prune deletes thousands of old tasks loses nothing and logs no error."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runifold_sync import WorkflowTask
from runifold_sync.errors import TaskNotFound
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store import TaskState
from runifold_sync.store.postgres.statements import Q
from runifold_sync.store.postgres.store import PostgresTransaction
from tests.pool.pool_app import read_ledger
from tests.support import processes

MONTH = timedelta(days=30)
APP = "tests.pool.pool_app:registry"


def _seed_finished(url: str, count: int, *, prefix: str = "old", events: int = 3) -> None:
    """``count`` tasks finished 60 days ago, each with ``events`` history events and a
    journal row, as a long-running store would hold them."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, outcome, created_at, updated_at) "
            "SELECT %(prefix)s || '-' || g, 'pool-flow', 1, 'default', '0', '0', 'terminal', 'completed', "
            "now() - interval '60 days' + g * interval '1 ms', "
            "now() - interval '60 days' + g * interval '1 ms' "
            "FROM generate_series(1, %(count)s) g",
            {"prefix": prefix, "count": count},
        )
        admin.execute(
            "INSERT INTO runifold_events (task_id, at, kind) "
            "SELECT %(prefix)s || '-' || g, now() - interval '60 days', 'completed' "
            "FROM generate_series(1, %(count)s) g, generate_series(1, %(events)s) e",
            {"prefix": prefix, "count": count, "events": events},
        )
        admin.execute(
            "INSERT INTO runifold_journal (task_id, journal, position, entry) "
            "SELECT %(prefix)s || '-' || g, '', 0, '{}' FROM generate_series(1, %(count)s) g",
            {"prefix": prefix, "count": count},
        )
        admin.execute("ANALYZE")


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url) as conn:
        [(n,)] = conn.execute(sql.encode()).fetchall()
        return int(n)


@pytest.mark.timeout(60)
def test_a_prune_skips_a_row_another_transaction_holds_instead_of_waiting(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    _seed_finished(postgres_url, 5)
    with psycopg.connect(postgres_url) as operator:  # say, a requeue in its transaction
        operator.execute("SELECT 1 FROM runifold_tasks WHERE task_id = 'old-3' FOR UPDATE")
        started = time.monotonic()
        assert pg.prune(MONTH, batch=2) == 4
        assert time.monotonic() - started < 10
    assert pg.get_task("old-3").state is TaskState.TERMINAL
    assert pg.prune(MONTH) == 1  # held no more: the next prune takes it


def test_the_prune_reads_the_finished_tasks_index_not_the_table(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    _seed_finished(postgres_url, 50_000, events=0)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, ready_at, created_at, updated_at) "
            "SELECT 'live-' || g, 'pool-flow', 1, 'default', '0', '0', 'queued', now(), "
            "now() - interval '60 days', now() FROM generate_series(1, 20000) g"
        )
        admin.execute("ANALYZE runifold_tasks")
    params: dict[str, Any] = {
        "after_at": datetime(1, 1, 1, tzinfo=UTC),  # where a walk starts
        "after_id": "",
        "cutoff": pg.now() - MONTH,
        "include_ambiguous": False,
        "limit": 1000,
    }
    with psycopg.connect(postgres_url) as conn:
        [(plan,)] = conn.execute(
            ("EXPLAIN (FORMAT JSON) " + Q["prune_candidates"]).encode(), params
        ).fetchall()
    nodes = list(_nodes(plan[0]["Plan"]))
    assert {node.get("Index Name") for node in nodes} - {None} == {"runifold_tasks_finished"}
    assert not any(node["Node Type"] == "Seq Scan" for node in nodes)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_an_enqueue_whose_conflicting_task_was_pruned_in_between_creates_the_task(
    pg: PostgresWorkflowStore, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The enqueue's INSERT met the old task; a prune on another connection deleted it
    and committed before the enqueue read it (the window is made certain here)."""
    _seed_finished(postgres_url, 1)
    pruner = PostgresWorkflowStore.connect(postgres_url, max_size=1)
    original = PostgresTransaction.one
    pruned: list[int] = []

    def one(self: PostgresTransaction, name: str, params: Any) -> Any:
        if name == "select_task" and not pruned:
            pruned.append(pruner.prune(MONTH))
        return original(self, name, params)

    monkeypatch.setattr(PostgresTransaction, "one", one)
    try:
        result = pg.enqueue(WorkflowTask.new("pool-flow", 1, 0, checkpoint_id="old-1"))
    finally:
        pruner.close()
    assert pruned == [1]
    assert result.created is True
    assert pg.get_task("old-1").state is TaskState.QUEUED
    assert [e.kind for e in pg.history("old-1")] == ["enqueued"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_pool_drains_new_work_while_a_prune_deletes_50000_old_tasks(
    postgres_url: str, tmp_path: Path
) -> None:
    old = 50_000
    store = PostgresWorkflowStore.connect(postgres_url, max_size=2)  # creates the schema
    _seed_finished(postgres_url, old)
    new = [f"new-{n:03d}" for n in range(120)]
    for n, task_id in enumerate(new):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    ledger = tmp_path / "ledger.txt"
    stderr = (tmp_path / "pool.err").open("w")
    command = ["run", "--app", APP, "--database", postgres_url, "--concurrency", "2", "--json"]
    command += ["--heartbeat", "1", "--lease", "5"]
    env = os.environ | {"POOL_LEDGER": str(ledger), "POOL_STEP_SECONDS": "0.005"}
    proc = processes.spawn("runifold_sync", *command, env=env, stderr=stderr, own_session=True)
    try:
        processes.wait_until(
            lambda: ledger.exists() and ledger.stat().st_size > 0, 60, "the pool's first step"
        )
        window: list[float] = [time.time()]
        pruned = store.prune(MONTH, batch=500)
        window.append(time.time())
        processes.wait_until(
            lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in new), 120, "every new task"
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        processes.kill(proc)
        stderr.close()
    assert pruned == old
    assert proc.returncode == 0, (tmp_path / "pool.err").read_text()
    report = json.loads(out)
    assert report["outcomes"]["completed"] == len(new)
    assert set(report["outcomes"]) <= {"completed", "idle"}  # no lost lease, no failure
    assert [store.get_task(t).result for t in new] == [n + 5 for n in range(len(new))]
    steps_meanwhile = [line for line in read_ledger(ledger) if window[0] <= line.at <= window[1]]
    assert steps_meanwhile, "the pool ran no step while the prune ran"
    logged = (tmp_path / "pool.err").read_text()
    assert "Traceback" not in logged and "ERROR" not in logged, logged
    assert _count(postgres_url, "SELECT count(*) FROM runifold_tasks") == len(new)
    assert _count(postgres_url, "SELECT count(*) FROM runifold_events WHERE task_id LIKE 'old-%'") == 0
    assert _count(postgres_url, "SELECT count(*) FROM runifold_journal WHERE task_id LIKE 'old-%'") == 0
    with pytest.raises(TaskNotFound):
        store.get_task("old-1")
    assert store.prune(MONTH) == 0  # the new tasks are recent
    store.close()
