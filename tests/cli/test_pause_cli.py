"""``pause`` and ``resume`` from the command line: text, ``--json``, the audit, and the
exit status of a refusal."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from runifold_sync import WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_pause_then_resume_a_queued_task(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    with SqliteWorkflowStore.open(str(sqlite_path)) as store:
        store.enqueue(WorkflowTask.new("flow", 1, None, checkpoint_id="t1"))
    code, out = _invoke("pause", "t1", "--actor", "alice", "--reason", "hold", "--database", url)
    assert (code, out) == (0, "t1: paused (queued)\n")
    code, out = _invoke("show", "t1", "--json", "--database", url)
    assert json.loads(out)["reason"] == "paused by alice: hold"
    code, out = _invoke("pause", "t1", "--actor", "alice", "--reason", "again", "--database", url)
    assert code == 1 and "already paused" in out
    code, out = _invoke("resume", "t1", "--actor", "bob", "--reason", "go", "--json", "--database", url)
    assert code == 0 and json.loads(out) == {"task_id": "t1", "state": "queued", "paused": False}
    with SqliteWorkflowStore.open(str(sqlite_path)) as store:
        assert store.get_task("t1").state is TaskState.QUEUED
        assert [e.kind for e in store.history("t1")][-2:] == ["paused", "resumed"]
