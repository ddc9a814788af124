"""The Flask extension driven through the example app (examples/flask_app) against real
SQLite store files: the test client's POST enqueues, ``flask runifold run`` executes."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from flask import Flask

from runifold_sync import WorkflowStore
from runifold_sync.errors import InputMismatch, InvalidArgument, StoreUsedAcrossFork, UnknownDefinition
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.base import open_here
from tests.support import processes

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "flask_app"
EXAMPLE_MODULES = ("app", "order_flow")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example's ``app`` module, imported fresh and forgotten afterwards."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in EXAMPLE_MODULES:
        sys.modules.pop(name, None)
    yield importlib.import_module("app")
    for name in EXAMPLE_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "workflows.db"


@pytest.fixture
def app(example: ModuleType, db: Path) -> Iterator[Flask]:
    flask_app: Flask = example.create_app({"TESTING": True, "RUNIFOLD_DATABASE_URL": f"sqlite:///{db}"})
    yield flask_app
    with flask_app.app_context():
        example.runifold.close()


@pytest.fixture
def store(app: Flask, db: Path) -> Iterator[SqliteWorkflowStore]:
    """A separate store on the same file, to look at what the app did."""
    s = SqliteWorkflowStore.open(db)
    yield s
    s.close()


def test_posted_order_is_enqueued_and_flask_runifold_run_once_completes_it(
    app: Flask, store: SqliteWorkflowStore
) -> None:
    response = app.test_client().post("/orders", json={"order_id": "a1", "sku": "tea", "quantity": 2})
    assert response.status_code == 202
    task_id = response.get_json()["task_id"]
    assert task_id == "order-a1"
    assert store.get_task(task_id).state is TaskState.QUEUED

    runner = app.test_cli_runner()
    result = runner.invoke(args=["runifold", "run", "--once", "--worker-id", "web-1"])

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1].startswith("Completed(task_id='order-a1'")
    record = store.get_task(task_id)
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    assert record.result == {"confirmation": "confirmation-a1", "reservation": "reservation-tea-2"}
    idle = runner.invoke(args=["runifold", "run", "--once"])
    assert (idle.exit_code, idle.output.strip()) == (0, "Idle()")


def test_run_once_exits_1_when_the_task_fails(app: Flask, store: SqliteWorkflowStore) -> None:
    app.test_client().post("/orders", json={"order_id": "bad", "sku": "tea", "quantity": 0})

    result = app.test_cli_runner().invoke(args=["runifold", "run", "--once"])

    assert result.exit_code == 1
    assert "Failed(task_id='order-bad'" in result.output
    assert store.get_task("order-bad").outcome is TaskOutcome.FAILED


def test_run_without_runifold_app_is_a_usage_error(example: ModuleType, db: Path) -> None:
    app = example.create_app({"RUNIFOLD_DATABASE_URL": f"sqlite:///{db}", "RUNIFOLD_APP": None})

    result = app.test_cli_runner().invoke(args=["runifold", "run", "--once"])

    assert result.exit_code == 1
    assert "has no workflows to run" in result.output and "RUNIFOLD_APP" in result.output


def test_store_is_opened_once_per_process_and_outlives_requests(example: ModuleType, app: Flask) -> None:
    client = app.test_client()
    with app.app_context():
        assert open_here() == []  # nothing opened before first use
    client.post("/orders", json={"order_id": "o1", "sku": "tea"})
    with app.app_context():
        first = example.runifold.store
        assert open_here() == [first]
    client.post("/orders", json={"order_id": "o2", "sku": "tea"})
    assert client.get("/orders/o1").get_json()["state"] == "queued"
    with app.app_context():
        assert example.runifold.store is first  # not closed or reopened per request


def test_forked_child_opens_its_own_store_and_leaves_the_parents_alone(
    example: ModuleType, app: Flask
) -> None:
    runifold = example.runifold
    with app.app_context():
        parent_store = runifold.store
        parent_pid = os.getpid()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: report over the pipe and never return into pytest
            report: dict[str, object]
            try:
                os.close(read_fd)
                report = _child_report(example, app, parent_store)
            except BaseException:
                report = {"error": traceback.format_exc()}
            finally:
                os.write(write_fd, json.dumps(report).encode())
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        child = json.loads(data)
        assert "error" not in child, child["error"]
        assert child["new_store"] and child["cached"]
        assert child["opened_by"] == child["pid"] != parent_pid
        assert f"opened in process {parent_pid}" in child["refused"]
        # The parent's store is still the same open store and sees the child's task.
        assert runifold.store is parent_store
        assert open_here() == [parent_store]
        assert parent_store.get_task(child["task_id"]).state is TaskState.QUEUED


def _child_report(example: ModuleType, app: Flask, parent_store: WorkflowStore) -> dict[str, object]:
    runifold = example.runifold
    child_store = runifold.store
    try:
        parent_store.get_task("order-x")
        refused = ""
    except StoreUsedAcrossFork as exc:
        refused = str(exc)
    report = {
        "new_store": child_store is not parent_store,
        "cached": runifold.store is child_store,
        "opened_by": os.getpid() if open_here() == [child_store] else None,
        "pid": os.getpid(),
        "refused": refused,
        "task_id": runifold.enqueue("order-intake", 1, {"order_id": "c", "sku": "s", "quantity": 1}),
    }
    runifold.close()  # what the exit handler does: closes only the child's store
    return report


def test_flask_runifold_run_pool_completes_tasks_and_stops_on_sigterm(
    app: Flask, db: Path, store: SqliteWorkflowStore
) -> None:
    client = app.test_client()
    task_ids = [
        client.post("/orders", json={"order_id": f"p{i}", "sku": "tea"}).get_json()["task_id"]
        for i in range(4)
    ]
    env = {**os.environ, "RUNIFOLD_DATABASE_URL": f"sqlite:///{db}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "app", "runifold", "run", "--concurrency", "2"],
        cwd=EXAMPLE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            if all(store.get_task(t).outcome is TaskOutcome.COMPLETED for t in task_ids):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        processes.kill(proc)
    assert proc.returncode == 0, err
    assert [store.get_task(t).outcome for t in task_ids] == [TaskOutcome.COMPLETED] * 4
    assert "'completed': 4" in out and "restarts: 0" in out


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("RUNIFOLD_CONCURRENCY", 0, "RUNIFOLD_CONCURRENCY must be an integer >= 1"),
        ("RUNIFOLD_HEARTBEAT_SECONDS", 20, "at most half the lease"),
        ("RUNIFOLD_APP", 42, "RUNIFOLD_APP must be"),
        ("RUNIFOLD_DATABASE_URL", 5, "RUNIFOLD_DATABASE_URL must be a string"),
        ("RUNIFOLD_CLAIM_BATCH", 0, r"RUNIFOLD_CLAIM_BATCH must be 'auto' or an integer in 1\.\.100, got 0"),
    ],
)
def test_init_app_rejects_invalid_settings(
    example: ModuleType, db: Path, setting: str, value: object, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        example.create_app({"RUNIFOLD_DATABASE_URL": f"sqlite:///{db}", setting: value})


def test_cli_commands_have_help(app: Flask) -> None:
    runner = app.test_cli_runner()
    group = runner.invoke(args=["runifold", "--help"])
    run = runner.invoke(args=["runifold", "run", "--help"])
    assert group.exit_code == run.exit_code == 0
    assert "Run runifold workflow workers" in group.output
    for text in ("--once", "--concurrency", "--worker-id", "exit status is 0"):
        assert text in run.output


def test_enqueue_with_runifold_app_set_checks_name_version_and_input_and_stores_nothing_bad(
    example: ModuleType, app: Flask, store: SqliteWorkflowStore
) -> None:
    """The extension's ``enqueue`` goes through the registry ``RUNIFOLD_APP`` names
    (``registry.task``); before, it stored whatever it was given."""
    with app.app_context():
        with pytest.raises(UnknownDefinition, match="order-intake"):  # the registered name is offered
            example.runifold.enqueue("order-intak", 1, {"order_id": "x"})
        with pytest.raises(InputMismatch, match="input.quantity"):
            example.runifold.enqueue("order-intake", 1, {"order_id": "b1", "sku": "tea", "quantity": "2"})
        task_id = example.runifold.enqueue("order-intake", 1, {"order_id": "b2", "sku": "tea", "quantity": 2})
    assert [t.task_id for t in store.list_tasks()] == [task_id]
