"""Every command that prints data has ``--json``, and what the newer ones print."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore

# Commands that print no data. A group only dispatches to its subcommands (and prints
# their help); every command proper prints something a script may want to read.
WITHOUT_JSON = {
    ("tenant",): "a group: it prints nothing but help",
    ("schedule",): "a group: it prints nothing but help",
    ("flow",): "a group: it prints nothing but help",
}


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    found: dict[tuple[str, ...], click.Command] = {}
    for name, command in group.commands.items():
        found[(*prefix, name)] = command
        if isinstance(command, click.Group):
            found |= _commands(command, (*prefix, name))
    return found


def test_every_command_that_prints_data_has_a_json_flag() -> None:
    commands = _commands(main)
    assert set(WITHOUT_JSON) <= set(commands)
    lacking = [
        " ".join(path)
        for path, command in commands.items()
        if path not in WITHOUT_JSON and "--json" not in {o for p in command.params for o in p.opts}
    ]
    assert lacking == []
    assert all(isinstance(commands[path], click.Group) for path in WITHOUT_JSON)


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    yield opened
    opened.close()


def _json(*args: str) -> object:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # warnings go to standard error


def test_migrate_json_gives_the_schema_version(url: str, store: SqliteWorkflowStore) -> None:
    assert _json("migrate", "--database", url) == {"schema_version": store.migrate()}


def test_signal_json_says_whether_it_was_delivered_and_what_was_checked(
    url: str, store: SqliteWorkflowStore
) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    args = ("signal", "t1", "approval", "--signal-id", "s1", "--sender", "ops", "--database", url)
    sent = {"task_id": "t1", "signal_id": "s1", "sender": "ops"}
    assert _json(*args) == sent | {"delivered": True, "checked": "unchecked"}
    assert _json(*args) == sent | {"delivered": False, "checked": None}


def test_cancel_json_gives_the_state_a_queued_and_a_running_task_are_left_in(
    url: str, store: SqliteWorkflowStore
) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="running"))
    store.claim(WorkerId.parse("w-0"), LeaseDuration(timedelta(seconds=30)))
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="queued"))
    args = ("--actor", "ops", "--reason", "duplicate", "--database", url)
    assert _json("cancel", "queued", *args) == {"task_id": "queued", "state": "cancelled", "cancelled": True}
    assert _json("cancel", "running", *args) == {"task_id": "running", "state": "leased", "cancelled": False}


def test_retry_json_gives_the_requeued_state(
    url: str, store: SqliteWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTCOME_DATABASE_URL", url)
    store.enqueue(WorkflowTask.new("outcome-flow", 1, "fail", checkpoint_id="t1"))
    CliRunner().invoke(main, ["run", "--app", "tests.cli.outcome_app:registry", "--database", url, "--once"])
    assert store.get_task("t1").state.value == "terminal"
    reason = ("--actor", "ops", "--reason", "data fixed", "--database", url)
    assert _json("retry", "t1", *reason) == {"task_id": "t1", "state": "queued"}


def test_tenant_set_json_gives_the_admission_as_tenant_list_does(url: str) -> None:
    limited = _json("tenant", "set", "acme", "--max-leased", "2", "--database", url)
    assert limited == _json("tenant", "list", "--database", url)[0]  # type: ignore[index]
    assert isinstance(limited, dict)
    assert (limited["tenant"], limited["max_leased"], limited["budget_cost"]) == ("acme", 2, None)
    unlimited = _json("tenant", "set", "acme", "--database", url)
    assert isinstance(unlimited, dict) and unlimited.keys() == limited.keys()  # the same fields
    assert unlimited == {
        "tenant": "acme",
        "max_leased": None,
        "leased": None,  # counted only for a tenant with a policy, which acme no longer has
        "budget_cost": None,
        "budget_window_s": None,
        "spent": None,
        "ready": None,
        "held": 0,
        "hold_reason": None,
    }
    assert _json("tenant", "list", "--database", url) == []


def test_tenant_set_help_has_no_markup() -> None:
    text = CliRunner().invoke(main, ["tenant", "set", "--help"]).output
    assert "``" not in text and "the fields of 'tenant list'" in " ".join(text.split())
