"""On PostgreSQL no store call keeps a worker past its lease, and a worker whose
heartbeat cannot get an answer from the store stops taking work and does not count the
leases it loses meanwhile as crashes.

- The store's connections carry libpq's network timeouts, derived from the lease of the
  worker using it (read back from the kernel's socket options), and the URL's own values
  win over them.
- A row lock held by another session stands in for a store that does not answer (what a
  worker sees of a partition: no reply): a step's commit blocked on it gives up by the
  lease's end (the cycle fails as an outage), where it used to wait for the lock however
  long it was held.
- A worker whose heartbeat thread gets no answer claims nothing until it gets one.
- A lease lost that way is not a crash: a task whose budget allows one claim without
  progress completes after such a loss, where the loss used to fail it as a crash loop.

The partitions themselves, in network namespaces, are ``tests/system/test_partitions.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runifold_sync import (
    Budget,
    CancellationToken,
    LeaseDuration,
    StepContext,
    WorkerId,
    WorkerReport,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import StoreUnavailable
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState

LEASE = LeaseDuration(timedelta(seconds=3))
HEARTBEAT = timedelta(seconds=1)
QUICK = {"min_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=100)}

flow = Workflow("bounded", 1)
# The test's hooks into the step bodies, per task id: a body sets STARTED[task] and waits
# for GO[task] (at most a minute) before it returns.
STARTED: dict[str, threading.Event] = {}
GO: dict[str, threading.Event] = {}
RUNS: list[str] = []


@pytest.fixture(autouse=True)
def _hooks() -> Iterator[None]:
    yield
    for event in GO.values():
        event.set()
    STARTED.clear()
    GO.clear()
    RUNS.clear()


@flow.step()
def hold(ctx: StepContext, n: int) -> int:
    RUNS.append(ctx.task_id)
    if ctx.task_id in STARTED:
        STARTED[ctx.task_id].set()
        GO[ctx.task_id].wait(60)
    return n + 1


@flow.step()
def finish(ctx: StepContext, n: int) -> int:
    return n * 10


@flow.main
def main(ctx: WorkflowContext, n: int) -> int:
    return finish(ctx, hold(ctx, n))


def _hooked(task_id: str) -> tuple[threading.Event, threading.Event]:
    STARTED[task_id], GO[task_id] = threading.Event(), threading.Event()
    return STARTED[task_id], GO[task_id]


def _worker(store: PostgresWorkflowStore, budget: Budget | None = None) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow, budget=budget or Budget()))
    return WorkflowWorker(store, registry, WorkerId.parse("bounded-1"), LEASE, HEARTBEAT)


@contextmanager
def _running(worker: WorkflowWorker) -> Iterator[Callable[[], WorkerReport]]:
    """``worker.run`` in a thread while the block runs; yields what stops it and reports."""
    token = CancellationToken()
    report: list[WorkerReport] = []
    thread = threading.Thread(target=lambda: report.append(worker.run(token, **QUICK)), daemon=True)
    thread.start()

    def stop() -> WorkerReport:
        token.cancel()
        thread.join(30)
        assert not thread.is_alive(), "the worker loop did not stop"
        return report[0]

    try:
        yield stop
    finally:
        token.cancel()
        thread.join(30)
        worker.close()


@contextmanager
def _locked(url: str, query: str, params: dict[str, Any]) -> Iterator[None]:
    """Another session holds the rows ``query`` selects FOR UPDATE while the block runs."""
    with psycopg.connect(url) as admin:
        rows = admin.execute(query + " FOR UPDATE", params).fetchall()
        assert rows, "nothing to lock"
        try:
            yield
        finally:
            admin.rollback()


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _tcp_option(conn: psycopg.Connection[Any], level: int, option: int) -> int:
    with socket.socket(fileno=socket.dup(conn.pgconn.socket)) as sock:
        return sock.getsockopt(level, option)


def test_the_connections_carry_network_timeouts_derived_from_the_lease_and_the_url_wins(
    postgres_url: str,
) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, min_size=1, max_size=2)
    try:
        _worker(store).close()  # a worker with a 3 s lease uses the store
        with store.dialect.pool.connection() as conn:
            params = conn.info.get_parameters()
            assert {
                key: params.get(key) for key in ("connect_timeout", "keepalives", "tcp_user_timeout")
            } == {
                "connect_timeout": "2",
                "keepalives": "1",
                "tcp_user_timeout": "1500",
            }
            # What the kernel holds for the socket: unacknowledged data drops the
            # connection after half the lease; an idle one is probed after a second.
            assert _tcp_option(conn, socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1500
            assert _tcp_option(conn, socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert _tcp_option(conn, socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
            assert _tcp_option(conn, socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    finally:
        store.close()
    own = PostgresWorkflowStore.connect(
        postgres_url + "?tcp_user_timeout=9000&keepalives_idle=7", min_size=1, max_size=2
    )
    try:
        _worker(own).close()
        with own.dialect.pool.connection() as conn:
            assert _tcp_option(conn, socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 9000
            assert _tcp_option(conn, socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
            assert conn.info.get_parameters()["connect_timeout"] == "2"  # not in the URL
    finally:
        own.close()


@pytest.mark.timeout(90)
def test_a_commit_that_gets_no_answer_gives_up_by_the_end_of_the_lease(postgres_url: str) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, max_size=4)
    store.enqueue(WorkflowTask.new("bounded", 1, 1, checkpoint_id="t1"))
    started, go = _hooked("t1")
    worker = _worker(store)
    outcome: list[object] = []

    def run_once() -> None:
        try:
            outcome.append(worker.run_once())
        except StoreUnavailable as exc:  # what a cycle whose store never answered raises
            outcome.append(exc)

    cycle = threading.Thread(target=run_once, daemon=True)
    try:
        cycle.start()
        assert started.wait(30), "the step never started"
        # The commit recording the step, and the heartbeats, wait on the row from now on.
        with _locked(postgres_url, "SELECT 1 FROM runifold_tasks WHERE task_id = %(t)s", {"t": "t1"}):
            go.set()
            began = time.monotonic()
            cycle.join(LEASE.seconds + 5)
            ended_s = time.monotonic() - began
            assert not cycle.is_alive(), "the cycle waited on the store past its lease"
        assert isinstance(outcome[0], StoreUnavailable), outcome
        assert ended_s < LEASE.seconds + 3, ended_s
        assert "CallTimedOut" in str(outcome[0]), outcome
    finally:
        go.set()
        cycle.join(60)
        worker.close()
        store.close()


@pytest.mark.timeout(90)
def test_a_worker_whose_heartbeat_gets_no_answer_claims_nothing_until_it_does(postgres_url: str) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, max_size=4)
    worker = _worker(store)
    with _running(worker) as stop:
        store.enqueue(WorkflowTask.new("bounded", 1, 0, checkpoint_id="warm-up"))
        _wait(lambda: store.get_task("warm-up").state is TaskState.TERMINAL, 30, "the worker never ran")
        # The heartbeat thread's registry update waits on the worker's row: no answer.
        with _locked(
            postgres_url, "SELECT 1 FROM runifold_workers WHERE worker_id = %(w)s", {"w": "bounded-1"}
        ):
            time.sleep(HEARTBEAT.total_seconds() * 3)  # a beat, and its attempt's bound
            store.enqueue_many([WorkflowTask.new("bounded", 1, n, checkpoint_id=f"t{n}") for n in range(3)])
            time.sleep(3.0)
            assert [store.get_task(f"t{n}").state for n in range(3)] == [TaskState.QUEUED] * 3
        _wait(
            lambda: all(store.get_task(f"t{n}").state is TaskState.TERMINAL for n in range(3)),
            30,
            "the worker did not take work again once its heartbeat got answers",
        )
        stop()
    store.close()


@pytest.mark.timeout(120)
def test_a_lease_lost_while_the_heartbeat_got_no_answer_is_not_counted_as_a_crash(postgres_url: str) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, max_size=4)
    store.enqueue(WorkflowTask.new("bounded", 1, 1, checkpoint_id="t1"))
    started, go = _hooked("t1")
    # One claim without progress allowed: a second such claim fails the task as a crash loop.
    worker = _worker(store, Budget(max_attempts=1))
    with _running(worker) as stop:
        assert started.wait(30), "the step never started"
        with _locked(postgres_url, "SELECT 1 FROM runifold_tasks WHERE task_id = %(t)s", {"t": "t1"}):
            # The heartbeats get no answer until the lease has run out; the step ends
            # after that, and its cycle finds the lease lost.
            time.sleep(LEASE.seconds + 2)
            go.set()
            time.sleep(1.0)
        _wait(lambda: store.get_task("t1").state is TaskState.TERMINAL, 60, "the task never ended")
        report = stop()
    record = store.get_task("t1")
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), record.reason
    assert record.result == 20
    assert report.outcomes.get("lease_lost") == 1, report.outcomes
    assert RUNS == ["t1", "t1"]  # the step ran again after the loss, once
    lost = [e for e in store.history("t1") if e.kind == "lease_lost"]
    assert [(e.worker_id, e.fencing_token) for e in lost] == [("bounded-1", 1)]
    store.close()
