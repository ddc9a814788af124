"""A command run with ``--json`` that fails prints ``{"error": ..., "type": ...}`` on
stdout besides the message on stderr, with the exit status unchanged (the top group does
it for every command: ``cli_common.JsonErrorsGroup``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync import WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore

APP = "tests.pool.pool_app:registry"


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _error(result: Result) -> dict[str, str]:
    """The one JSON object a failed command printed on stdout."""
    [line] = result.stdout.splitlines()
    found = json.loads(line)
    assert isinstance(found, dict)
    return found


def test_enqueue_of_an_unknown_workflow_answers_in_json_with_the_error_and_its_type(url: str) -> None:
    result = _invoke("enqueue", "--app", APP, "invoic", "1", "--database", url, "--json")
    assert result.exit_code == 1
    message = "no workflow named 'invoic' is registered; this registry has 'pool-flow' (version 1)"
    error = _error(result)
    assert error["type"] == "UnknownDefinition" and error["error"].startswith(message)
    assert result.stderr.startswith(f"Error: {message}")  # stderr as before


def test_wait_for_an_unknown_task_answers_in_json_and_without_json_prints_nothing_on_stdout(url: str) -> None:
    _invoke("migrate", "--database", url)
    result = _invoke("wait", "nope", "--database", url, "--json")
    assert result.exit_code == 1
    assert _error(result) == {"error": "no task with id 'nope'", "type": "TaskNotFound"}
    assert "Error: no task with id 'nope'" in result.stderr
    plain = _invoke("wait", "nope", "--database", url)
    assert plain.exit_code == 1 and plain.stdout == "" and "no task with id 'nope'" in plain.stderr


def test_a_refused_signal_answers_in_json(url: str, sqlite_path: Path) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    store.close()
    send = ("signal", "t1", "approval", "--signal-id", "s1", "--sender", "manager", "--database", url)
    assert _invoke(*send, "--payload", '{"approved": true}', "--json").exit_code == 0
    result = _invoke(*send, "--payload", '{"approved": false}', "--json")
    assert result.exit_code == 1
    message = "signal 's1' was already delivered to task 't1' with a different name or payload"
    error = _error(result)
    assert error["type"] == "SignalConflict" and error["error"].startswith(message)
    assert f"Error: {error['error']}" in result.stderr


def test_a_bad_option_value_with_json_is_a_usage_error_answered_in_json(url: str) -> None:
    # --json is read first, whatever its place, so a bad value before it is answered in JSON too.
    result = _invoke("wait", "t1", "--json", "--timeout", "soon", "--database", url)
    assert result.exit_code == 2
    assert _error(result) == {
        "error": "Invalid value for '--timeout': 'soon' is not a duration (30s, 5m, 1h30m, 2d)",
        "type": "BadParameter",
    }
    assert "Usage:" in result.stderr
