"""``run`` as a pool, in a real process: worker recycling with ``--recycle-after``."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import Settings, WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.errors import RunifoldError
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState
from tests.support import processes

APP = "tests.pool.pool_app:registry"


@pytest.mark.timeout(120)
def test_run_recycles_workers_after_three_tasks_in_their_slots_and_finishes_every_task(
    sqlite_path: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{sqlite_path}"
    store = SqliteWorkflowStore.open(sqlite_path)
    ids = [f"r{n:02d}" for n in range(12)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    command = ["run", "--app", APP, "--database", url]
    command += ["--concurrency", "2", "--worker-id", "recycler", "--recycle-after", "3", "--json"]
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt")}
    proc = processes.spawn("runifold_sync", *command, env=env, own_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if all(store.get_task(t).state is TaskState.TERMINAL for t in ids):
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        processes.kill(proc)
    report = json.loads(out)
    assert proc.returncode == 0
    assert [store.get_task(t).result for t in ids] == [n + 5 for n in range(12)]
    assert report["outcomes"]["completed"] == 12
    # 12 tasks, a worker replaced after each 3: at least 3 recycles (each slot ran >= 3).
    assert report["recycled"] >= 3 and report["restarts"] == 0
    assert set(report["per_worker"]) == {"recycler-0", "recycler-1"}
    store.close()


def test_recycle_after_setting_must_be_a_positive_integer() -> None:
    with pytest.raises(RunifoldError, match="RUNIFOLD_RECYCLE_AFTER must be an integer >= 1, got 0"):
        Settings.from_mapping({"RUNIFOLD_RECYCLE_AFTER": 0})
    assert Settings.from_mapping({"RUNIFOLD_RECYCLE_AFTER": 3}).pool.recycle_after_tasks == 3


def test_max_backoff_setting_is_checked_and_reaches_the_pools_workers() -> None:
    with pytest.raises(RunifoldError, match="max_backoff 0.001 s .*RUNIFOLD_MAX_BACKOFF_SECONDS=0.001"):
        Settings.from_mapping({"RUNIFOLD_MAX_BACKOFF_SECONDS": 0.001})
    assert Settings.from_mapping({}).pool.max_backoff == timedelta(seconds=5)
    assert Settings.from_mapping({"RUNIFOLD_MAX_BACKOFF_SECONDS": 0.5}).pool.max_backoff == timedelta(
        seconds=0.5
    )


@pytest.mark.parametrize("worker_id", ["bad id", "w" * 123])
def test_run_refuses_a_worker_id_its_pool_slots_could_not_use_naming_the_option(
    sqlite_path: Path, worker_id: str
) -> None:
    """``w`` * 123 is a worker id of its own but not a base: ``<it>-1.999`` (a later
    incarnation of slot 1) is 129 characters."""
    result = CliRunner().invoke(
        main,
        ["run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--concurrency", "2"]
        + ["--worker-id", worker_id],
    )
    assert result.exit_code == 2
    assert "--worker-id must be 1-122 characters" in result.stderr and repr(worker_id) in result.stderr
    assert SqliteWorkflowStore.open(sqlite_path).workers() == []  # no worker started
