"""A worker records itself in the store's registry when it starts working, stays fresh
while idle, and is marked stopped when closed."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
)
from runifold_sync.sqlite import SqliteWorkflowStore


def _registry() -> WorkflowRegistry:
    registry = WorkflowRegistry()
    for version in (1, 2):
        workflow = Workflow("served", version)

        @workflow.main
        def main(ctx: WorkflowContext, _input: None) -> None: ...

        registry.register(WorkflowDefinition(workflow))
    return registry


def test_a_worker_registers_with_its_versions_stays_seen_while_idle_and_is_stopped_on_close(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    worker = WorkflowWorker(
        sqlite_store,
        _registry(),
        WorkerId.parse("reg-1"),
        LeaseDuration(timedelta(seconds=1)),
        timedelta(milliseconds=100),
    )
    assert sqlite_store.workers() == []  # nothing is written before the worker works
    assert worker.run_once().kind == "idle"
    (record,) = sqlite_store.workers()
    assert (record.worker_id, record.host, record.pid) == ("reg-1", socket.gethostname(), os.getpid())
    assert record.definitions == [("served", 1), ("served", 2)]
    first_seen = record.last_seen
    time.sleep(0.35)  # idle: only the heartbeat thread keeps it fresh
    (record,) = sqlite_store.workers()
    assert record.last_seen > first_seen and record.live(timedelta(seconds=1))
    worker.close()
    (record,) = sqlite_store.workers()
    assert record.stopped_at is not None and not record.live(timedelta(hours=1))


def test_the_heartbeat_thread_ends_when_its_store_is_closed_under_an_unclosed_worker(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    name = "runifold-heartbeat-orphan"
    worker = WorkflowWorker(
        sqlite_store,
        _registry(),
        WorkerId.parse("orphan"),
        LeaseDuration(timedelta(seconds=1)),
        timedelta(seconds=0.02),
    )
    worker.run_once()  # registers the worker and starts its heartbeat thread
    assert name in {t.name for t in threading.enumerate()}
    sqlite_store.close()  # the owner forgot worker.close()
    deadline = time.monotonic() + 5
    while name in {t.name for t in threading.enumerate()} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert name not in {t.name for t in threading.enumerate()}
