"""A human approval across real processes, on SQLite and PostgreSQL: a worker process
runs the workflow to ``request_approval`` and exits, the CLI (another process) sends the
decision, and a worker process with another id finishes the task. Forged and
cross-tenant decisions sent through the CLI are refused where they are sent (exit 1) and
kept in the history.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import processes

PROCESS_TIMEOUT_S = 30.0
TASK = "exp-1"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'approvals.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def store(database_url: str) -> Iterator[WorkflowStore]:
    opened = open_store(database_url)
    opened.enqueue(
        WorkflowTask.new(
            "expense", 1, {"claim_id": "c-42", "amount": 1200}, tenant="acme", checkpoint_id=TASK
        )
    )
    yield opened
    opened.close()


def run_worker(database_url: str, worker_id: str) -> dict[str, Any]:
    """One worker process, one ``run_once``: its outcome as printed."""
    done = processes.run(
        "tests.system.approval_app",
        "--database",
        database_url,
        "--worker-id",
        worker_id,
        timeout_s=PROCESS_TIMEOUT_S,
    )
    assert done.returncode == 0, f"worker {worker_id} exited {done.returncode}: {done.stderr}"
    (line,) = done.stdout.splitlines()
    outcome: dict[str, Any] = json.loads(line)
    return outcome


def cli_signal(
    database_url: str, payload: str, *, signal_id: str, sender: str, tenant: str = "acme"
) -> subprocess.CompletedProcess[str]:
    return processes.run(
        "runifold_sync",
        "signal",
        TASK,
        "approval",
        "--payload",
        payload,
        "--signal-id",
        signal_id,
        "--sender",
        sender,
        "--tenant",
        tenant,
        "--database",
        database_url,
        timeout_s=PROCESS_TIMEOUT_S,
    )


def waiting_outcome() -> dict[str, Any]:
    return {
        "outcome": "suspended",
        "task_id": TASK,
        "reason": "waiting for signal 'approval'",
        "wake_at": None,
    }


def test_an_approval_sent_through_the_cli_lets_another_worker_process_finish_the_task(
    store: WorkflowStore, database_url: str
) -> None:
    assert run_worker(database_url, "approver-1") == waiting_outcome()
    assert store.get_task(TASK).state is TaskState.WAITING

    sent = cli_signal(
        database_url, '{"approved": true, "reason": "ok"}', signal_id="decision-1", sender="manager"
    )
    assert (sent.returncode, sent.stdout) == (0, f"{TASK}: signal decision-1 delivered\n"), sent.stderr

    finished = run_worker(database_url, "approver-2")

    result = {
        "submitted": "submitted c-42 for 1200",
        "approver": "manager",
        "approved": True,
        "reason": "ok",
        "booked": "booked c-42",
    }
    assert finished == {"outcome": "completed", "task_id": TASK, "result": result}
    record = store.get_task(TASK)
    assert (record.state, record.outcome, record.result) == (
        TaskState.TERMINAL,
        TaskOutcome.COMPLETED,
        result,
    )
    history = store.history(TASK)
    assert [e.worker_id for e in history if e.kind == "claimed"] == ["approver-1", "approver-2"]
    (consumed,) = [e for e in history if e.kind == "signal_consumed"]
    assert (consumed.worker_id, consumed.detail["signal_id"], consumed.detail["sender"]) == (
        "approver-2",
        "decision-1",
        "manager",
    )


def test_forged_and_cross_tenant_approvals_through_the_cli_are_refused_and_recorded(
    store: WorkflowStore, database_url: str
) -> None:
    assert run_worker(database_url, "approver-1") == waiting_outcome()

    # A non-approver's decision is refused by the store, which the waiting approval told
    # who decides it ...
    forged = cli_signal(
        database_url, '{"approved": true, "reason": "me"}', signal_id="forged", sender="intern"
    )
    assert (forged.returncode, forged.stderr) == (
        1,
        f"Error: signal 'forged' to task {TASK!r} refused: 'intern' is not an approver of 'approval' "
        "(its approvers now: manager)\n",
    )
    # ... and a sender of another tenant is answered as if the task did not exist.
    foreign = cli_signal(
        database_url, '{"approved": true}', signal_id="foreign", sender="mallory", tenant="globex"
    )
    assert (foreign.returncode, foreign.stderr) == (1, f"Error: no task with id {TASK!r}\n")

    # Neither is kept, nor wakes the task; both refusals are in its history.
    record = store.get_task(TASK)
    assert (record.state, store.pending_signals(TASK)) == (TaskState.WAITING, [])
    refused = {e.detail["signal_id"]: e for e in store.history(TASK) if e.kind == "signal_refused"}
    assert set(refused) == {"forged", "foreign"}
    assert refused["forged"].detail["sender"] == "intern"
    assert refused["forged"].worker_id is None
    assert "'intern' is not an approver of 'approval'" in refused["forged"].detail["refused"]
    assert refused["foreign"].detail["sender"] == "mallory"
    assert refused["foreign"].worker_id is None
    assert "tenant 'globex'" in refused["foreign"].detail["refused"]

    # The manager's rejection still decides the task.
    rejected = cli_signal(
        database_url, '{"approved": false, "reason": "over budget"}', signal_id="decision-1", sender="manager"
    )
    assert rejected.returncode == 0, rejected.stderr
    finished = run_worker(database_url, "approver-2")
    assert finished["outcome"] == "completed"
    assert finished["result"]["approver"] == "manager"
    assert (finished["result"]["approved"], finished["result"]["booked"]) == (False, "returned c-42")
