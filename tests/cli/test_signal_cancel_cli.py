"""The ``signal`` and ``cancel`` commands through CliRunner, against a SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    opened.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1", tenant="acme"))
    yield opened
    opened.close()


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _signal(url: str, payload: str, *extra: str) -> tuple[int, str]:
    return _invoke(
        "signal",
        "t1",
        "approval",
        "--payload",
        payload,
        "--signal-id",
        "s1",
        "--sender",
        "manager",
        "--tenant",
        "acme",
        "--database",
        url,
        *extra,
    )


def test_signal_delivers_the_payload_with_sender_and_reason(store: SqliteWorkflowStore, url: str) -> None:
    code, out = _signal(url, '{"approved": true, "reason": "ok"}', "--reason", "reviewed the quote")

    assert code == 0 and out.startswith("t1: signal s1 accepted, not yet validated: no registry has told")
    (pending,) = store.pending_signals("t1", "approval")
    assert (pending.signal_id, pending.sender, pending.reason) == ("s1", "manager", "reviewed the quote")
    assert pending.payload_json == '{"approved":true,"reason":"ok"}'
    received = store.history("t1")[-1]
    assert received.kind == "signal_received"
    assert received.detail["sender"] == "manager" and received.detail["reason"] == "reviewed the quote"


def test_signal_sent_again_with_the_same_id_reports_already_delivered(
    store: SqliteWorkflowStore, url: str
) -> None:
    _signal(url, '{"approved": true, "reason": "ok"}')

    # the same JSON written differently is the same payload
    code, out = _signal(url, '{"reason":"ok",  "approved":true}')

    assert (code, out) == (0, "t1: signal s1 already delivered\n")
    assert len(store.pending_signals("t1", "approval")) == 1


@pytest.mark.parametrize("payload", ["{approved: yes}", "NaN", "[Infinity]"])
def test_signal_with_a_payload_that_is_not_json_is_a_usage_error_naming_payload(
    store: SqliteWorkflowStore, url: str, payload: str
) -> None:
    code, out = _signal(url, payload)

    assert code == 2
    assert "--payload" in out and "not JSON" in out
    assert store.pending_signals("t1", "approval") == []


def test_signal_reusing_an_id_with_another_payload_is_refused(store: SqliteWorkflowStore, url: str) -> None:
    _signal(url, '{"approved": true}')

    code, out = _signal(url, '{"approved": false}')

    assert code == 1
    assert "Error: signal 's1' was already delivered to task 't1' with a different name or payload" in out
    (pending,) = store.pending_signals("t1", "approval")
    assert pending.payload_json == '{"approved":true}'


def test_signal_from_another_tenant_answers_as_for_no_such_task_and_is_recorded(
    store: SqliteWorkflowStore, url: str
) -> None:
    def send(task_id: str) -> tuple[int, str]:
        options = ("--signal-id", "x", "--sender", "mallory", "--tenant", "globex", "--database", url)
        return _invoke("signal", task_id, "approval", *options)

    assert send("t1") == (1, "Error: no task with id 't1'\n")
    assert send("t9") == (1, "Error: no task with id 't9'\n")  # the same for a task that does not exist
    refused = store.history("t1")[-1]
    assert (refused.kind, refused.detail["sender"]) == ("signal_refused", "mallory")
    assert refused.detail["refused"] == "sender's tenant 'globex' is not the task's tenant 'acme'"


def test_cancel_of_a_queued_task_cancels_it_at_once(store: SqliteWorkflowStore, url: str) -> None:
    code, out = _invoke("cancel", "t1", "--actor", "ops", "--reason", "duplicate", "--database", url)

    assert (code, out) == (0, "t1: cancelled\n")
    record = store.get_task("t1")
    assert (record.state, record.reason) == (TaskState.CANCELLED, "cancelled by ops: duplicate")


def test_cancel_of_a_running_task_says_its_worker_stops_at_the_next_boundary(
    store: SqliteWorkflowStore, url: str
) -> None:
    store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))

    code, out = _invoke("cancel", "t1", "--actor", "ops", "--reason", "stop", "--database", url)

    assert (code, out) == (0, "t1: running; its worker stops at the next step boundary\n")
    assert store.get_task("t1").state is TaskState.LEASED


def test_cancel_of_a_waiting_task_with_steps_to_undo_says_a_worker_compensates_them(
    store: SqliteWorkflowStore, url: str
) -> None:
    (claimed,) = store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    undo = '{"compensated":[],"undo":["reserve#1"]}'
    store.suspend(claimed.lease, claimed.revision, undo, wake_at=None, reason="waiting", signal="go")

    code, out = _invoke("cancel", "t1", "--actor", "ops", "--reason", "stop", "--database", url)

    assert (code, out) == (0, "t1: cancelling; a worker runs its compensations, then it ends cancelled\n")
    assert store.get_task("t1").state is TaskState.QUEUED


def test_cancel_of_a_finished_task_fails_with_the_reason(store: SqliteWorkflowStore, url: str) -> None:
    (claimed,) = store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    store.complete(claimed.lease, claimed.revision, "{}", '"done"')

    code, out = _invoke("cancel", "t1", "--actor", "ops", "--reason", "too late", "--database", url)

    assert code == 1
    assert "Error: task 't1' is terminal; only an unfinished task can be cancelled" in out
    assert store.get_task("t1").state is TaskState.TERMINAL
