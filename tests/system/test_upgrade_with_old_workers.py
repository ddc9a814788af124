"""Migrating to schema version 7 while a worker of the previous release (schema 6) is
inside a step: from the migration on, that worker writes nothing (its statements name the
renamed checkpoint column, and it answers with the store error it retries as an outage),
and a worker of this release finishes the task from the migrated checkpoint. Only the
step that was in flight at the migration runs again, as after a crash.

The previous release is the package at ``PREVIOUS``, exported from this repository's
history with ``git archive``; a checkout without that history cannot run the test (it
fails under ``CI``, where the checkout is a clone).
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest

from runifold_sync import WorkerId, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import processes
from tests.support.backends import Backend
from tests.support.journals import entries

from . import upgrade_app

PREVIOUS = "ee50681"  # the last commit with schema version 6
pytestmark = pytest.mark.timeout(120)


def _previous_release(into: Path) -> Path:
    """The ``runifold_sync`` package of ``PREVIOUS``, exported under ``into``."""
    done = subprocess.run(
        ["git", "-C", str(processes.ROOT), "archive", PREVIOUS, "runifold_sync"], capture_output=True
    )
    if done.returncode != 0:
        message = f"cannot export {PREVIOUS} from this checkout's history: {done.stderr.decode()[-300:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with tempfile.TemporaryFile() as archive:
        archive.write(done.stdout)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as files:
            files.extractall(into, filter="data")
    return into


def test_a_previous_release_worker_writes_nothing_after_the_migration_and_the_task_finishes_on_the_new_one(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = _previous_release(tmp_path / "previous")
    ledger, gate = tmp_path / "ledger.txt", tmp_path / "gate"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(previous), str(processes.ROOT)]),
        UPGRADE_LEDGER=str(ledger),
        UPGRADE_GATE=str(gate),
    )
    # Started outside the repository root, whose package would come first on sys.path.
    old = subprocess.Popen(
        processes.command("tests.system.upgrade_app", "--url", backend.url, "--worker-id", "old"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        processes.wait_until(
            lambda: ledger.exists() and "work#2" in ledger.read_text(), 60, "the old worker in step 2"
        )
        store = backend.open()  # this release: migrates to version 7 under the old worker
        gate.touch()
        stdout, stderr = old.communicate(timeout=60)
    finally:
        processes.kill(old)
    assert old.returncode == 0, stderr
    lines = stdout.splitlines()
    package = lines[0]
    cycle = next(line for line in lines if line.startswith("cycle "))
    claim = next(line for line in lines if line.startswith("claim "))
    assert package == f"package: {previous / 'runifold_sync'}"  # the previous release ran
    assert cycle.startswith("cycle raised StoreUnavailable") and "checkpoint" in cycle, stdout
    assert claim.startswith("claim raised StoreUnavailable") and "checkpoint" in claim, stdout
    events = store.history("u1")
    assert [(e.kind, e.worker_id) for e in events if e.worker_id == "old"] == [("claimed", "old")]
    assert store.get_task("u1").state is TaskState.LEASED  # the old lease, left to expire

    store.set_clock_offset(timedelta(seconds=5))  # past the old worker's lease
    monkeypatch.setenv("UPGRADE_LEDGER", str(ledger))
    monkeypatch.setenv("UPGRADE_GATE", str(gate))
    worker = WorkflowWorker(
        store, upgrade_app.registry(), WorkerId.parse("new"), upgrade_app.LEASE, timedelta(seconds=0.5)
    )
    try:
        ended = [worker.run_once(), worker.run_once()]
    finally:
        worker.close()
    outcomes = {getattr(outcome, "task_id", None): outcome for outcome in ended}
    assert {task_id: (o.kind, getattr(o, "result", None)) for task_id, o in outcomes.items()} == {
        "u1": ("completed", 6),
        "u2": ("completed", 6),  # enqueued by the old worker, which could not claim it
    }
    record = store.get_task("u1")
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    runs = [line.split()[0] for line in ledger.read_text().splitlines()]
    assert runs.count("work#1") == 2 and runs.count("work#3") == 2  # once for each task
    assert runs.count("work#2") == 3  # u1's in flight at the migration ran again
    assert [e["call_id"] for e in entries(store, "u1")] == ["work#1", "work#2", "work#3"]
