"""``signal`` without ``--signal-id`` or ``--sender``: the id is derived from the task, the
signal's name and its payload (and printed), so a command run twice delivers once, as a
given id would; the sender is the OS user running the command, recorded as the sender."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync import WorkflowTask
from runifold_sync.cli.main import derived_signal_id, main
from runifold_sync.errors import SignalConflict
from runifold_sync.sqlite import SqliteWorkflowStore

OS_USER = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    opened.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    yield opened
    opened.close()


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


def _signal(url: str, payload: str, *extra: str) -> Result:
    args = ["signal", "t1", "nudge", "--payload", payload, "--database", url, *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_with_neither_the_id_is_derived_and_printed_and_the_os_user_is_the_sender(
    store: SqliteWorkflowStore, url: str
) -> None:
    sent = _signal(url, '{"n": 1}')
    assert sent.exit_code == 0, sent.output
    signal_id = derived_signal_id("t1", "nudge", '{"n":1}')
    assert sent.stdout.startswith(
        f"t1: signal {signal_id} (derived from the task, name and payload) from {OS_USER} (the OS user) "
    )
    (pending,) = store.pending_signals("t1", "nudge")
    assert (pending.signal_id, pending.sender) == (signal_id, OS_USER)


def test_the_same_signal_sent_again_is_delivered_once_and_another_payload_is_another(
    store: SqliteWorkflowStore, url: str
) -> None:
    first = _signal(url, '{"n": 1}', "--json")
    again = _signal(url, '{ "n" : 1 }', "--json")  # the same JSON, written otherwise
    other = _signal(url, '{"n": 2}', "--json")
    assert [json.loads(r.stdout)["delivered"] for r in (first, again, other)] == [True, False, True]
    assert json.loads(first.stdout)["signal_id"] == json.loads(again.stdout)["signal_id"]
    assert json.loads(first.stdout)["sender"] == OS_USER
    assert len(store.pending_signals("t1", "nudge")) == 2


def test_given_ids_and_senders_are_used_as_given_and_still_deduplicate(
    store: SqliteWorkflowStore, url: str
) -> None:
    sent = _signal(url, '{"n": 1}', "--signal-id", "s1", "--sender", "ops", "--json")
    assert json.loads(sent.stdout) == {
        "task_id": "t1",
        "signal_id": "s1",
        "sender": "ops",
        "delivered": True,
        "checked": "unchecked",
    }
    conflicting = _signal(url, '{"n": 2}', "--signal-id", "s1", "--sender", "ops")
    assert conflicting.exit_code == 1 and "already delivered" in conflicting.stderr
    with pytest.raises(SignalConflict):  # the store's rule, unchanged
        store.send_signal("t1", "nudge", {"n": 3}, signal_id="s1", sender="ops")
    # a derived id names one task's signal: the same payload to another task is its own
    assert derived_signal_id("t2", "nudge", '{"n":1}') != derived_signal_id("t1", "nudge", '{"n":1}')
    assert derived_signal_id("t1", "other", '{"n":1}') != derived_signal_id("t1", "nudge", '{"n":1}')
