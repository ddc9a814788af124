"""Log records about a task carry its task id, worker id and fencing token, and both
formatters put them on the line."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import timedelta

import pytest

from runifold_sync import (
    EffectEvidence,
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.engine.logs import FIELDS, JsonFormatter, TextFormatter
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.routing import checkpointed_by_other_steps

LEASE = LeaseDuration(timedelta(seconds=30))


def _record(message: str, exc_info: bool = False, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("runifold_sync.worker.worker", logging.WARNING, __file__, 1, message, (), None)
    if exc_info:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            record.exc_info = sys.exc_info()
    record.__dict__.update(extra)
    return record


def test_the_text_formatter_appends_the_task_fields_before_any_traceback() -> None:
    fields = {"task_id": "t1", "worker_id": "host-0", "fencing_token": 3}
    text = TextFormatter().format(_record("lease lost", exc_info=True, **fields))
    first, *rest = text.splitlines()
    expected = (
        f"WARNING runifold_sync.worker.worker [{os.getpid()}] lease lost"
        " task_id=t1 worker_id=host-0 fencing_token=3"
    )
    assert first.endswith(expected)
    assert rest[0].startswith("Traceback") and "RuntimeError: boom" in text
    assert TextFormatter().format(_record("idle")).endswith("idle")


def test_the_json_formatter_writes_one_object_per_record_with_the_fields_present() -> None:
    line = JsonFormatter().format(
        _record("task failed", exc_info=True, task_id="t1", worker_id="w", fencing_token=2)
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "task failed" and entry["level"] == "WARNING"
    assert (entry["task_id"], entry["worker_id"], entry["fencing_token"]) == ("t1", "w", 2)
    assert "RuntimeError: boom" in entry["exception"]
    assert "task_id" not in json.loads(JsonFormatter().format(_record("worker stopped", worker_id="w")))


def test_every_record_the_worker_writes_about_a_task_carries_its_fields(
    sqlite_store: SqliteWorkflowStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="runifold_sync")
    workflow = Workflow("logged", 1)

    def lookup(ctx: StepContext) -> EffectEvidence:
        raise ConnectionError("payment provider unreachable")

    @workflow.effect(idempotent=False, reconcile=lookup, retry=RetryPolicy(max_attempts=2))
    def charge(ctx: StepContext) -> str:
        raise TimeoutError("no answer")

    @workflow.step()
    def outlive(ctx: StepContext) -> None:
        sqlite_store.set_clock_offset(timedelta(minutes=20))  # past the lease
        sqlite_store.claim(WorkerId.parse("other"), LEASE)
        time.sleep(0.3)  # the heartbeat thread finds the lease gone

    @workflow.main
    def main(ctx: WorkflowContext, kind: str) -> str:
        if kind == "charge":
            return charge(ctx)
        outlive(ctx)
        return "late"

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    worker = WorkflowWorker(sqlite_store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=0.05))
    try:
        sqlite_store.enqueue(WorkflowTask.new("logged", 1, "charge", checkpoint_id="c1"))
        assert worker.run_once().kind == "retried"
        sqlite_store.set_clock_offset(timedelta(minutes=10))
        assert worker.run_once().kind == "failed"  # the reconcile raised: ambiguous
        sqlite_store.enqueue(WorkflowTask.new("logged", 1, "outlive", checkpoint_id="o1"))
        assert worker.run_once().kind == "lease_lost"
        checkpointed_by_other_steps(sqlite_store, "logged", 1, "u1")
        assert worker.run_once().kind == "definition_unavailable"
    finally:
        worker.close()

    about_tasks = [r for r in caplog.records if r.name != "runifold_sync.store"]
    messages = " | ".join(r.getMessage() for r in about_tasks)
    for expected in ("reconcile of c1/charge#1", "task failed", "no longer held", "definition unavailable"):
        assert expected in messages
    # A lost lease is reported once, not at every heartbeat until the cycle ends.
    assert [r.getMessage() for r in about_tasks].count("lease lost") == 1
    loggers = {r.name for r in about_tasks}
    assert loggers == {
        "runifold_sync.workflow.context",
        "runifold_sync.worker.worker",
        "runifold_sync.worker.heartbeat",
    }
    for record in about_tasks:
        assert all(hasattr(record, name) for name in FIELDS), record.getMessage()
    assert {r.task_id for r in about_tasks} == {"c1", "o1", "u1"}  # type: ignore[attr-defined]
