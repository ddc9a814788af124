"""Cancel of a running task across real processes, on SQLite and PostgreSQL: a worker
process runs a long task of short steps, ``python -m runifold_sync cancel`` (another
process) asks it to stop, and the worker process stops at its next step boundary (its
heartbeat is far too slow to have told it), undoes its steps and ends the task cancelled.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.store import TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support import processes
from tests.support.backends import Backend
from tests.support.journals import entries
from tests.system.cancel_app import STEPS

PROCESS_TIMEOUT_S = 60.0
TASK = "batch-1"

pytestmark = pytest.mark.timeout(180)


def _steps_committed(store: WorkflowStore) -> int:
    return len(entries(store, TASK))


def test_a_cli_cancel_stops_a_worker_process_at_its_next_step_boundary(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("batch", 1, STEPS, checkpoint_id=TASK))
    worker = processes.spawn(
        "tests.system.cancel_app", "--database", backend.url, "--worker-id", "w1", stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while _steps_committed(store) < 5:
            assert time.monotonic() < deadline and worker.poll() is None, "the worker never got going"
            time.sleep(0.02)

        cancel = processes.run(
            "runifold_sync",
            "cancel",
            TASK,
            "--actor",
            "ops",
            "--reason",
            "batch no longer needed",
            "--database",
            backend.url,
            timeout_s=PROCESS_TIMEOUT_S,
        )
        committed_at_cancel = _steps_committed(store)
        stdout, stderr = worker.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        processes.kill(worker)

    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"{TASK}: running; its worker stops at the next step boundary\n"
    assert worker.returncode == 0, stderr
    note = "cancelled by ops: batch no longer needed"
    assert json.loads(stdout) == {"outcome": "cancelled", "task_id": TASK, "reason": note}
    record = store.get_task(TASK)
    assert (record.state, record.reason) == (TaskState.CANCELLED, note)
    checkpoint = read_checkpoint(store, TASK)
    assert checkpoint is not None
    # At most the step committed late (a result is saved at the next boundary) and the
    # step in flight when the cancel landed ran after it.
    assert committed_at_cancel <= len(checkpoint.journal) <= committed_at_cancel + 2 < STEPS
    assert checkpoint.compensated == list(reversed(checkpoint.undo))
    assert len(checkpoint.undo) == len(checkpoint.journal)
    history = store.history(TASK)
    requested = [e for e in history if e.kind == "cancel_requested"]
    assert [e.detail for e in requested] == [{"actor": "ops", "reason": "batch no longer needed"}]
    assert history[-1].kind == "cancelled"
