"""``run --lease`` given alone: the heartbeat is a third of the lease (it was a fixed 10 s,
so ``--lease 2`` was refused); a heartbeat given with it is still checked against it."""

from __future__ import annotations

import json
import os
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


@pytest.mark.timeout(60)
def test_a_lease_given_alone_runs_with_a_heartbeat_of_a_third_of_it(
    sqlite_path: Path, tmp_path: Path
) -> None:
    """Five steps of 0.6 s under a 2 s lease: only a heartbeat well inside the lease keeps
    it (the task completes under its first fencing token, never taken over)."""
    store = SqliteWorkflowStore.open(sqlite_path)
    store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="t1"))
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt"), "POOL_STEP_SECONDS": "0.6"}
    command = ["run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--lease", "2", "--once"]
    try:
        done = processes.run("runifold_sync", *command, "--json", env=env, timeout_s=50)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["outcome"] == "completed"
        task = store.get_task("t1")
        assert task.state is TaskState.TERMINAL and task.fencing_token == 1
    finally:
        store.close()


def test_the_settings_derive_the_heartbeat_from_the_lease_when_it_is_not_given() -> None:
    def heartbeat(values: dict[str, float]) -> timedelta:
        return Settings.from_mapping(values).worker.heartbeat_interval

    assert heartbeat({"RUNIFOLD_LEASE_SECONDS": 2}) == timedelta(seconds=2 / 3)
    assert heartbeat({}) == timedelta(seconds=10)  # 30 s lease
    assert heartbeat({"RUNIFOLD_LEASE_SECONDS": 0.1}) == timedelta(seconds=0.1 / 3)


def test_an_explicit_heartbeat_that_contradicts_the_lease_is_still_refused(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    result = CliRunner().invoke(
        main, ["run", "--app", APP, "--database", url, "--lease", "2", "--heartbeat", "1.5"]
    )
    assert result.exit_code == 1
    assert "must be at most half the lease_duration" in result.output
    with pytest.raises(RunifoldError, match="at most half the lease"):
        Settings.from_mapping({"RUNIFOLD_LEASE_SECONDS": 2, "RUNIFOLD_HEARTBEAT_SECONDS": 1.5})


def test_run_help_says_the_heartbeats_default() -> None:
    result = CliRunner().invoke(main, ["run", "--help"])
    assert "[default: a third of the lease]" in " ".join(result.output.split())
