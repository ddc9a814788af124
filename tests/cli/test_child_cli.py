"""Child workflows from the command line: ``list --parent``, ``show`` naming a task's
parent and children with their states, and ``versions --app`` counting the versions
children reference."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.system import child_app, crash_app

CHILD = "p1:child:kid-1"


def parent_only() -> WorkflowRegistry:
    """An app that serves the parent but not the child's definition."""
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(child_app.parent))
    return registry


@pytest.fixture
def url(sqlite_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store where parent ``p1`` waits for its queued child."""
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(tmp_path / "ledger.txt"))
    store = SqliteWorkflowStore.open(str(sqlite_path))
    store.enqueue(WorkflowTask.new("family", 1, "order-1", checkpoint_id="p1"))
    lease = LeaseDuration(timedelta(seconds=30))
    worker = WorkflowWorker(store, child_app.registry(), WorkerId.parse("w"), lease, timedelta(seconds=5))
    try:
        assert worker.run_once().kind == "suspended"
    finally:
        worker.close()
        store.close()
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_list_parent_lists_a_tasks_children(url: str) -> None:
    code, out = _invoke("list", "--parent", "p1", "--json", "--database", url)
    assert code == 0
    assert [(t["task_id"], t["parent"], t["state"]) for t in json.loads(out)] == [(CHILD, "p1", "queued")]
    code, out = _invoke("list", "--parent", CHILD, "--json", "--database", url)
    assert code == 0 and json.loads(out) == []


def test_show_names_a_tasks_children_and_a_childs_parent_with_their_states(url: str) -> None:
    code, out = _invoke("show", "p1", "--database", url)
    assert code == 0 and f"child: {CHILD} kid v1 queued" in out
    code, out = _invoke("show", CHILD, "--database", url)
    assert code == 0 and "parent: p1 family v1 waiting" in out
    code, out = _invoke("show", "p1", "--json", "--database", url)
    shown = json.loads(out)
    assert shown["children"] == [{"task_id": CHILD, "definition": "kid", "version": 1, "state": "queued"}]
    assert shown["parent_task"] is None
    code, out = _invoke("show", CHILD, "--json", "--database", url)
    assert json.loads(out)["parent_task"]["state"] == "waiting"


def test_versions_app_reports_a_version_only_a_child_references(url: str) -> None:
    code, out = _invoke(
        "versions", "--app", "tests.cli.test_child_cli:parent_only", "--database", url, "--json"
    )
    assert code == 1 and json.loads(out)["missing"] == [{"name": "kid", "version": 1}]
