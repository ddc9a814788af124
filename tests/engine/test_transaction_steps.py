"""``@workflow.transaction()`` on every backend: the body writes through ``ctx.connection``
in the store transaction that records its completion, so its rows exist exactly when its
checkpoint entry does. A body that raises, or a commit refused for a lost lease, rolls
the body's rows back; a replay returns the recorded output without running it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runifold_sync import (
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.outcomes import Completed, Failed, LeaseLost, Retried, Suspended
from runifold_sync.store import TaskState
from runifold_sync.store.open import sqlite_path
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def _sql(connection: Any, sql: str) -> str:
    """``?`` placeholders as the connection's driver spells them."""
    return sql if isinstance(connection, sqlite3.Connection) else sql.replace("?", "%s")


flow = Workflow("booking", 1)


@flow.transaction()
def book(ctx: StepContext, mode: str) -> int:
    RAN.append(f"book {ctx.attempt}")
    conn = ctx.connection
    conn.execute(
        _sql(conn, "INSERT INTO app_ledger (task_id, attempt) VALUES (?, ?)"), (ctx.task_id, ctx.attempt)
    )
    if mode == "fail-once" and ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after its write")
    if mode == "lose-lease":  # store time jumps past the lease inside this very transaction
        column, jump = (
            ("offset_us", 3_600_000_000) if isinstance(conn, sqlite3.Connection) else ("offset_s", 3600)
        )
        conn.execute(f"UPDATE runifold_clock SET {column} = {column} + {jump}")
    if mode == "wrong-type":  # annotated int
        return "100"  # type: ignore[return-value]
    return 100


@flow.main
def main(ctx: WorkflowContext, mode: str) -> int:
    booked = book(ctx, mode)
    if mode == "sleep":
        ctx.sleep(timedelta(minutes=1))
    return booked


@pytest.fixture
def app_rows(backend: Backend) -> Iterator[Any]:
    """The application's table in the store's database, and a reader of its rows."""
    if backend.kind == "sqlite":
        conn: Any = sqlite3.connect(sqlite_path(backend.url), isolation_level=None)
    else:
        conn = psycopg.connect(backend.direct_url, autocommit=True)
    conn.execute("CREATE TABLE app_ledger (task_id TEXT NOT NULL, attempt INTEGER NOT NULL)")
    yield lambda: [tuple(r) for r in conn.execute("SELECT task_id, attempt FROM app_ledger").fetchall()]
    conn.close()


def _cycle(store: WorkflowStore) -> Any:
    return run_cycle(store, WorkflowDefinition(flow))


def test_a_transaction_steps_writes_commit_with_its_completion(store: WorkflowStore, app_rows: Any) -> None:
    store.enqueue(WorkflowTask.new("booking", 1, "ok", checkpoint_id="t1"))
    assert _cycle(store) == Completed("t1", 100)
    assert app_rows() == [("t1", 1)]
    assert [(e["call_id"], e["status"], e["output"]) for e in entries(store, "t1")] == [
        ("book#1", "done", 100)
    ]


def test_a_replay_returns_the_recorded_output_without_running_the_body(
    store: WorkflowStore, clock: Clock, app_rows: Any
) -> None:
    store.enqueue(WorkflowTask.new("booking", 1, "sleep", checkpoint_id="t1"))
    assert isinstance(_cycle(store), Suspended)
    clock.advance(timedelta(minutes=2))
    assert _cycle(store) == Completed("t1", 100)
    assert RAN == ["book 1"] and app_rows() == [("t1", 1)]


def test_a_body_that_raises_rolls_its_writes_back_and_is_retried(
    store: WorkflowStore, clock: Clock, app_rows: Any
) -> None:
    store.enqueue(WorkflowTask.new("booking", 1, "fail-once", checkpoint_id="t1"))
    assert isinstance(_cycle(store), Retried)
    assert app_rows() == []  # the failed attempt's row went with its transaction
    clock.advance(timedelta(minutes=10))
    assert _cycle(store) == Completed("t1", 100)
    assert app_rows() == [("t1", 2)] and RAN == ["book 1", "book 2"]


def test_a_commit_refused_for_a_lost_lease_rolls_the_body_back(store: WorkflowStore, app_rows: Any) -> None:
    store.enqueue(WorkflowTask.new("booking", 1, "lose-lease", checkpoint_id="t1"))
    assert isinstance(_cycle(store), LeaseLost)
    assert app_rows() == []
    assert entries(store, "t1") == []
    assert store.get_task("t1").state is TaskState.LEASED  # its lease runs out; a worker takes it again


def test_an_output_that_does_not_fit_the_annotation_fails_the_step_and_rolls_it_back(
    store: WorkflowStore, app_rows: Any
) -> None:
    store.enqueue(WorkflowTask.new("booking", 1, "wrong-type", checkpoint_id="t1"))
    outcome = _cycle(store)
    assert isinstance(outcome, Failed) and outcome.cause == "bad_output"
    assert outcome.reason.startswith(
        "step 'book' returned '100', which does not fit its return annotation int: "
        "output: expected an integer, got the string '100'"
    )
    assert app_rows() == [] and entries(store, "t1") == []  # the body's writes went with it
    assert RAN == ["book 1"]
