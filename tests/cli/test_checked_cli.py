"""``enqueue --app`` and ``signal`` against what the application declares (issue 19,
findings 3, 4 and 5), through CliRunner on a SQLite file: unknown names and versions and
input that does not fit are refused before anything is stored (exit 1, the reason
printed); without ``--app`` a warning names the risk; a signal the task's definition would
refuse exits 1, and one the store cannot judge yet says it is not yet validated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync import LeaseDuration, WorkerId, WorkflowWorker
from runifold_sync.cli.main import main
from runifold_sync.outcomes import Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.cli.checked_app import registry

APP = "tests.cli.checked_app:registry"
GOOD = '{"invoice_id": 7, "lines": [{"sku": "a-1", "qty": 2}]}'


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    yield opened
    opened.close()


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _enqueue(url: str, name: str, version: str, input_json: str, *extra: str) -> Result:
    return _invoke(
        "enqueue", name, version, "--input", input_json, "--checkpoint-id", "t1", "--database", url, *extra
    )


def _signal(url: str, name: str, payload: str, signal_id: str, sender: str, *extra: str) -> Result:
    return _invoke(
        "signal",
        "t1",
        name,
        "--payload",
        payload,
        "--signal-id",
        signal_id,
        "--sender",
        sender,
        "--database",
        url,
        *extra,
    )


def _run_until_waiting(store: SqliteWorkflowStore) -> None:
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)
    )
    try:
        assert isinstance(worker.run_once(), Suspended)
    finally:
        worker.close()


def test_enqueue_with_app_refuses_an_unknown_name_naming_the_registered_ones(
    url: str, store: SqliteWorkflowStore
) -> None:
    result = _enqueue(url, "invoyce", "1", GOOD, "--app", APP)

    assert result.exit_code == 1
    assert result.stderr == (
        "Error: no workflow named 'invoyce' is registered; this registry has 'invoice' (version 1); "
        "'refund' (version 1). Did you mean 'invoice'?\n"
    )
    assert store.list_tasks() == []


def test_enqueue_with_app_refuses_an_unknown_version(url: str, store: SqliteWorkflowStore) -> None:
    result = _enqueue(url, "invoice", "2", GOOD, "--app", APP)

    assert (result.exit_code, result.stderr) == (
        1,
        "Error: 'invoice' has no version 2 in this registry, only version 1\n",
    )
    assert store.list_tasks() == []


def test_enqueue_with_app_refuses_input_that_does_not_fit_naming_each_field(
    url: str, store: SqliteWorkflowStore
) -> None:
    result = _enqueue(url, "invoice", "1", '{"invoice_id": "7", "lines": [{"sku": "a-1"}]}', "--app", APP)

    assert result.exit_code == 1
    assert result.stderr == (
        "Error: input of 'invoice' version 1 does not fit tests.cli.checked_app.Invoice: "
        "input.invoice_id: expected an integer, got the string '7'; "
        "input.lines[0].qty: required field missing\n"
    )
    assert store.list_tasks() == []


def test_enqueue_with_app_stores_a_task_that_fits_without_a_warning(
    url: str, store: SqliteWorkflowStore
) -> None:
    result = _enqueue(url, "invoice", "1", GOOD, "--app", APP, "--json")

    assert (result.exit_code, json.loads(result.stdout), result.stderr) == (
        0,
        {"task_id": "t1", "created": True, "not_before": None},
        "",
    )
    assert store.get_task("t1").input == json.loads(GOOD)


def test_enqueue_without_app_warns_that_nothing_was_checked(url: str, store: SqliteWorkflowStore) -> None:
    result = _enqueue(url, "invoyce", "1", GOOD, "--json")

    assert result.exit_code == 0 and json.loads(result.stdout) == {
        "task_id": "t1",
        "created": True,
        "not_before": None,
    }
    assert result.stderr == (
        "warning: 'invoyce' version 1 and its input were not checked (no --app): a name or version "
        "no worker serves waits unclaimed until one does (stats names it), and input that does not "
        "fit fails the task when it runs\n"
    )


def test_signal_to_a_task_enqueued_with_app_refuses_a_misspelt_name(
    url: str, store: SqliteWorkflowStore
) -> None:
    _enqueue(url, "invoice", "1", GOOD, "--app", APP)

    refused = _signal(url, "reciept", '"r.pdf"', "s1", "ops")
    kept = _signal(url, "receipt", '"r.pdf"', "s2", "ops")

    assert (refused.exit_code, refused.stderr) == (
        1,
        "Error: signal 's1' to task 't1' refused: signal 'reciept' is not declared by 'invoice' "
        "version 1 (it declares 'approval', 'receipt')\n",
    )
    assert (kept.exit_code, kept.stdout) == (
        0,
        "t1: signal s2 delivered; kept until the task waits for 'receipt', "
        "which checks the sender and payload\n",
    )
    assert [s.signal_id for s in store.pending_signals("t1")] == ["s2"]


def test_signal_to_a_waiting_approval_refuses_a_non_approver_and_a_malformed_decision(
    url: str, store: SqliteWorkflowStore
) -> None:
    _enqueue(url, "invoice", "1", GOOD, "--app", APP)
    _signal(url, "receipt", '"r.pdf"', "s1", "ops")
    _run_until_waiting(store)  # takes the receipt, then waits for the approval

    intern = _signal(url, "approval", '{"approved": true}', "a1", "intern")
    malformed = _signal(url, "approval", '{"approved": "yes"}', "a2", "manager", "--json")
    decided = _signal(url, "approval", '{"approved": true, "reason": "ok"}', "a3", "manager", "--json")

    assert (intern.exit_code, intern.stderr) == (
        1,
        "Error: signal 'a1' to task 't1' refused: 'intern' is not an approver of 'approval' "
        "(its approvers now: manager)\n",
    )
    assert malformed.exit_code == 1 and "an approval payload must be" in malformed.stderr
    assert (decided.exit_code, json.loads(decided.stdout)) == (
        0,
        {"task_id": "t1", "signal_id": "a3", "sender": "manager", "delivered": True, "checked": "waiting"},
    )
    assert [e.detail["signal_id"] for e in store.history("t1") if e.kind == "signal_refused"] == ["a1", "a2"]


def test_signal_to_a_task_no_registry_has_seen_is_accepted_but_not_yet_validated(
    url: str, store: SqliteWorkflowStore
) -> None:
    _enqueue(url, "invoice", "1", GOOD)

    result = _signal(url, "reciept", '"r.pdf"', "s1", "ops")

    assert result.exit_code == 0
    assert result.stdout == (
        "t1: signal s1 accepted, not yet validated: no registry has told the store this task's "
        "signals yet (enqueue with --app, or start a worker that serves it); its next wait decides, "
        "and `show` records a refusal\n"
    )
