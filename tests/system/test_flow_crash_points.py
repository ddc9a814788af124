"""The enqueue's flow writes killed (SIGKILL) inside their transaction, on both stores: a
debounced input folded into the key's queued task, a singleton's replaced task
cancelled, and a batch's tasks and events written together (``bulk_enqueue``). Nothing of
the killed enqueue is stored, and the next enqueue does it whole."""

from __future__ import annotations

import os
import signal

import pytest

from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskState
from tests.support import processes
from tests.support.backends import Backend

from . import flow_enqueue_app

FLOW_CASES = {"debounce": "flow_enqueue:doc", "singleton": "flow_enqueue:sync"}
BULK_CASE = "bulk_enqueue:second"


def enqueue(backend: Backend, kind: str, task_id: str, value: int, crash: str | None) -> None:
    env = dict(os.environ, RUNIFOLD_CRASH_AT=crash) if crash else dict(os.environ)
    args = ("--url", backend.url, "--kind", kind, "--task-id", task_id, "--value", str(value))
    proc = processes.run("tests.system.flow_enqueue_app", *args, env=env, timeout_s=60)
    if crash:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
        assert f"runifold crash point {crash} reached" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("kind", sorted(FLOW_CASES))
def test_a_flow_enqueue_killed_in_its_transaction_stores_nothing(kind: str, backend: Backend) -> None:
    store = backend.open()
    store.enqueue(flow_enqueue_app.task(kind, "first", 1))
    enqueue(backend, kind, "second", 2, FLOW_CASES[kind])
    first = store.get_task("first")
    assert (first.state, first.input_json) == (TaskState.QUEUED, to_json({"v": 1}))
    assert [t.task_id for t in store.list_tasks()] == ["first"]
    enqueue(backend, kind, "third", 3, None)  # the store is left as it was: this one applies
    if kind == "debounce":
        assert store.get_task("first").input_json == to_json({"v": 3})
        assert [t.task_id for t in store.list_tasks()] == ["first"]
    else:
        assert store.get_task("first").state is TaskState.CANCELLED
        assert store.get_task("third").state is TaskState.QUEUED


def test_a_batch_killed_after_its_tasks_and_events_are_written_stores_none_of_them(backend: Backend) -> None:
    store = backend.open()
    store.enqueue_many(flow_enqueue_app.batch("first", 1))
    enqueue(backend, "bulk", "second", 2, BULK_CASE)
    assert {t.task_id for t in store.list_tasks(limit=100)} == {
        t.task_id for t in flow_enqueue_app.batch("first", 1)
    }
    assert store.history("second") == []
    enqueue(backend, "bulk", "second", 2, None)  # the same batch again: written whole
    second = flow_enqueue_app.batch("second", 2)
    for task in second:
        record = store.get_task(task.task_id)
        assert (record.state, record.input_json) == (TaskState.QUEUED, to_json({"v": 2}))
        assert [e.kind for e in store.history(task.task_id)] == ["enqueued"]
    assert len(store.list_tasks(limit=100)) == 2 * flow_enqueue_app.BULK_SIZE
