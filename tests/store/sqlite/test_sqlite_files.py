"""A new SQLite store file, and the write-ahead log beside it, are readable by their owner
only: they hold every task's input and result. A file that exists keeps its mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from runifold_sync import WorkflowTask
from runifold_sync.sqlite import SqliteWorkflowStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_database_and_its_wal_are_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "workflows.db"
    previous = os.umask(0o022)  # the usual umask, which would give 0644
    try:
        with SqliteWorkflowStore.open(path) as store:
            store.enqueue(WorkflowTask.new("orders", 1, {"card": "4242"}))
            assert _mode(path) == 0o600
            assert _mode(Path(f"{path}-wal")) == 0o600
    finally:
        os.umask(previous)


def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with SqliteWorkflowStore.open(path):
        pass
    path.chmod(0o640)  # an operator's choice, e.g. a group that reads it
    with SqliteWorkflowStore.open(path):
        assert _mode(path) == 0o640
