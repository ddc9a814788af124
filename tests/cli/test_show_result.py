"""``show`` without ``--json`` prints what a task ended with: a completed task's result,
a failed task's error class and the step it failed in (``--json`` has them as
``result`` and ``failure``). Before, only the JSON had the result, and the failure's
class and step were only inside the history's raw event detail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync.cli.main import main

APP = "tests.cli.outcome_app:registry"


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _ran(url: str, mode: str) -> None:
    _invoke(
        "enqueue",
        "outcome-flow",
        "1",
        "--input",
        json.dumps(mode),
        "--checkpoint-id",
        mode,
        "--database",
        url,
    )
    _invoke("run", "--app", APP, "--database", url, "--once")


def test_show_prints_a_completed_tasks_result(url: str) -> None:
    _ran(url, "done")
    shown = _invoke("show", "done", "--database", url)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[1:3] == ["state: terminal (completed)", 'result: "done"']
    assert "failure:" not in shown.stdout


def test_show_prints_what_a_failed_task_failed_with_and_where(url: str) -> None:
    _ran(url, "fail")
    shown = _invoke("show", "fail", "--database", url)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[1:4] == [
        "state: terminal (failed)",
        "reason: step 'broken' raised RuntimeError: bad data; gave up after 1 attempt",
        "failure: RuntimeError in step broken",
    ]
    assert "result:" not in shown.stdout
    as_json = json.loads(_invoke("show", "fail", "--database", url, "--json").stdout)
    assert as_json["failure"] == {
        "reason": "step 'broken' raised RuntimeError: bad data; gave up after 1 attempt",
        "error_class": "RuntimeError",
        "step_id": "broken",
        "effect_key": None,
    }
    assert as_json["result"] is None


def test_an_unfinished_task_shows_neither(url: str) -> None:
    _ran(url, "suspend")
    shown = _invoke("show", "suspend", "--database", url)
    assert "result:" not in shown.stdout and "failure:" not in shown.stdout
    assert json.loads(_invoke("show", "suspend", "--database", url, "--json").stdout)["failure"] is None
