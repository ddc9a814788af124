"""The SQLite store's durability settings, read back from the connections it really uses:
WAL, and ``synchronous=FULL`` unless the caller asks for another level, on the step
thread's connection and on the heartbeat thread's own one (the store opens one
connection per thread, so the heartbeat's is a separate connection with its own
per-connection ``synchronous`` setting). An ambiguous effect is only told apart from a
lost one if the intent commit survived a power loss, which needs FULL."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.sqlite import SqliteWorkflowStore

LEASE = LeaseDuration(timedelta(seconds=2))
HEARTBEAT = timedelta(milliseconds=50)
WAIT_S = 20.0
SYNCHRONOUS_FULL, SYNCHRONOUS_NORMAL = 2, 1  # what PRAGMA synchronous reads back


def _pragmas(conn: sqlite3.Connection) -> tuple[str, int]:
    return conn.execute("PRAGMA journal_mode").fetchone()[0], conn.execute("PRAGMA synchronous").fetchone()[0]


def _run_until_a_heartbeat_extended_the_lease(
    store: SqliteWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> set[str]:
    """Run one task whose step waits for the heartbeat thread to extend its lease; the
    names of the threads that opened SQLite connections meanwhile (the real ``connect``,
    only noted)."""
    opened_by: set[str] = set()
    real_connect = sqlite3.connect

    def noting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened_by.add(threading.current_thread().name)
        return real_connect(*args, **kwargs)

    workflow = Workflow("durable", 1)

    @workflow.step()
    def wait_for_heartbeat(ctx: StepContext) -> str:
        claimed_until = store.get_task(ctx.task_id).lease_expires
        deadline = time.monotonic() + WAIT_S
        while store.get_task(ctx.task_id).lease_expires == claimed_until:
            assert time.monotonic() < deadline, "the heartbeat thread never extended the lease"
            time.sleep(0.02)
        return "extended"

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return wait_for_heartbeat(ctx)

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    store.enqueue(WorkflowTask.new("durable", 1, None, checkpoint_id="d1"))
    worker = WorkflowWorker(store, registry, WorkerId.parse("durable-w"), LEASE, HEARTBEAT)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(sqlite3, "connect", noting_connect)
            assert worker.run_once().kind == "completed"
    finally:
        worker.close()  # joins the heartbeat thread, so its connection is idle now
    return opened_by


@pytest.mark.parametrize(
    ("options", "synchronous"),
    [({}, SYNCHRONOUS_FULL), ({"synchronous": "NORMAL"}, SYNCHRONOUS_NORMAL)],
    ids=["default-full", "explicit-normal"],
)
def test_step_and_heartbeat_connections_use_wal_and_the_chosen_synchronous_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str], synchronous: int
) -> None:
    path = tmp_path / "durable.db"
    with SqliteWorkflowStore.open(path, **options) as store:
        opened_by = _run_until_a_heartbeat_extended_the_lease(store, monkeypatch)
        assert opened_by == {"runifold-heartbeat-durable-w"}  # the step thread's was opened by open()
        connections = store.dialect.connections  # every connection the store opened, one per thread
        assert len(connections) == 2
        for conn in connections:
            assert _pragmas(conn.raw) == ("wal", synchronous)
    # WAL is a property of the file: a fresh connection of anyone else sees it too.
    outside = sqlite3.connect(path)
    try:
        assert outside.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        outside.close()


def test_a_child_enqueue_leaves_the_connection_syncing_its_commits_again(tmp_path: Path) -> None:
    """A child's enqueue commits without syncing the log (the parent's next commit syncs
    it); every commit after it, on the same connection, syncs again."""
    store = SqliteWorkflowStore.open(tmp_path / "wf.db")
    try:
        store.enqueue_child(WorkflowTask.new("kid", 1, 1, checkpoint_id="kid-1"))
        conn = store.dialect._conn().raw
        assert _pragmas(conn) == ("wal", SYNCHRONOUS_FULL)
        assert store.get_task("kid-1").state.value == "queued"
    finally:
        store.close()
