"""The Django integration driven through the example project (examples/django_project).

Not collected by the main run: ``test_django.py`` runs this file with pytest in a
subprocess whose ``DJANGO_SETTINGS_MODULE`` is ``tests.contrib.django_settings``, so
Django's global setup never reaches the other tests. Transactions here are real (no test
case wraps them), so ``on_commit`` callbacks run exactly when Django would run them.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import django
import pytest

django.setup()

from django.core.management import ManagementUtility, call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from shop.models import Order  # noqa: E402

from runifold_sync import WorkflowStore, WorkflowTask  # noqa: E402
from runifold_sync.contrib.django import (  # noqa: E402
    close_store,
    enqueue,
    enqueue_on_commit,
    get_store,
    runifold_settings,
)
from runifold_sync.errors import InputMismatch, InvalidArgument, StoreUsedAcrossFork, TaskNotFound  # noqa: E402
from runifold_sync.sqlite import SqliteWorkflowStore  # noqa: E402
from runifold_sync.store import TaskOutcome, TaskState  # noqa: E402
from tests.support import processes  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_project"

pytestmark = pytest.mark.timeout(60)


class Rollback(Exception):
    pass


@pytest.fixture(scope="module", autouse=True)
def django_tables() -> None:
    call_command("migrate", verbosity=0)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    """A fresh store file for each case, through the settings the integration reads."""
    store_url = f"sqlite:///{tmp_path}/workflows.db"
    with override_settings(RUNIFOLD_DATABASE_URL=store_url):
        yield store_url
    close_store()


@pytest.fixture
def store(url: str, tmp_path: Path) -> Iterator[SqliteWorkflowStore]:
    """A separate store on the same file, to look at what the integration did."""
    s = SqliteWorkflowStore.open(tmp_path / "workflows.db")
    yield s
    s.close()


def task_count(store: SqliteWorkflowStore) -> int:
    with sqlite3.connect(store.path) as conn:
        count: int = conn.execute("SELECT count(*) FROM runifold_tasks").fetchone()[0]
    return count


def post_order(quantity: int = 2) -> dict[str, str]:
    response = Client().post(
        "/orders/", {"sku": "tea", "quantity": quantity}, content_type="application/json"
    )
    assert response.status_code == 202, response.content
    body: dict[str, str] = response.json()
    return body


def test_view_inside_a_committed_transaction_enqueues_only_at_commit(store: SqliteWorkflowStore) -> None:
    with transaction.atomic():
        body = post_order()
        with pytest.raises(TaskNotFound):
            store.get_task(body["task_id"])  # the view's own atomic block is only a savepoint
    assert store.get_task(body["task_id"]).state is TaskState.QUEUED
    assert store.get_task(body["task_id"]).input == body["order_id"]
    assert Order.objects.get(pk=body["order_id"]).task_id == body["task_id"]


def test_view_inside_a_rolled_back_transaction_enqueues_nothing(store: SqliteWorkflowStore) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        body = post_order()
        raise Rollback
    with pytest.raises(TaskNotFound):
        store.get_task(body["task_id"])
    assert not Order.objects.filter(task_id=body["task_id"]).exists()
    assert task_count(store) == 0


def test_view_in_autocommit_enqueues_when_its_atomic_block_commits(store: SqliteWorkflowStore) -> None:
    body = post_order()
    assert store.get_task(body["task_id"]).state is TaskState.QUEUED


def test_enqueue_on_commit_checks_its_arguments_at_the_call(store: SqliteWorkflowStore) -> None:
    with transaction.atomic():
        with pytest.raises(InvalidArgument, match="version"):
            enqueue_on_commit("order-intake", 0, 1)
        with pytest.raises(InvalidArgument, match="not JSON-serializable"):
            enqueue_on_commit("order-intake", 1, object())


def test_manage_py_help_runworkflows_describes_the_command_and_each_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ManagementUtility(["manage.py", "help", "runworkflows"]).execute()
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert text.startswith("usage: manage.py runworkflows ")
    assert "Run runifold workflow workers: a supervised pool of forked worker processes" in text
    assert "The store and registry come from RUNIFOLD_DATABASE_URL and RUNIFOLD_APP." in text
    for option, described in (
        ("--concurrency CONCURRENCY", "Worker processes (default: RUNIFOLD_CONCURRENCY, else 1)."),
        ("--once", "Claim and run one task in this process, then exit."),
        ("--worker-id WORKER_ID", "Stable base id; pool workers are <base>-<slot> (default: the host name)."),
    ):
        assert f"{option} {described}" in text


def test_runworkflows_once_completes_the_task_and_its_effect_updates_the_row(
    store: SqliteWorkflowStore,
) -> None:
    body = post_order()
    out = io.StringIO()

    call_command("runworkflows", "--once", "--worker-id", "cron-1", stdout=out)

    assert out.getvalue().startswith(f"Completed(task_id='{body['task_id']}', result='confirmed')")
    record = store.get_task(body["task_id"])
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    assert Order.objects.get(pk=body["order_id"]).status == "confirmed"
    out = io.StringIO()
    call_command("runworkflows", "--once", stdout=out)
    assert out.getvalue().strip() == "Idle()"


def test_enqueue_checks_the_input_against_the_registry_runifold_app_names(store: SqliteWorkflowStore) -> None:
    with pytest.raises(InputMismatch, match="expected an integer, got the string 'not-an-order-id'"):
        enqueue("order-intake", 1, "not-an-order-id")
    assert store.list_tasks() == []


def test_runworkflows_once_fails_with_status_1_when_the_task_fails(store: SqliteWorkflowStore) -> None:
    # Past the registry's check (a task stored by an older release, say): it fails when run.
    task_id = store.enqueue(WorkflowTask.new("order-intake", 1, "not-an-order-id")).task_id

    with pytest.raises(CommandError, match="failed") as raised:
        call_command("runworkflows", "--once", stdout=io.StringIO())

    assert raised.value.returncode == 1
    assert store.get_task(task_id).outcome is TaskOutcome.FAILED


def test_invalid_settings_are_a_command_error(url: str) -> None:
    with override_settings(RUNIFOLD_LEASE_SECONDS=4, RUNIFOLD_HEARTBEAT_SECONDS=3):
        with pytest.raises(InvalidArgument, match="at most half the lease"):
            runifold_settings()
        with pytest.raises(CommandError, match="at most half the lease"):
            call_command("runworkflows", "--once")


@pytest.mark.parametrize("concurrency", ["0", "-2"])
def test_a_concurrency_below_one_is_a_command_error_naming_it(url: str, concurrency: str) -> None:
    with pytest.raises(CommandError, match=f"--concurrency must be an integer >= 1, got {concurrency}"):
        call_command("runworkflows", "--concurrency", concurrency)


def test_get_store_is_per_process_and_a_forked_child_opens_its_own(url: str) -> None:
    parent_store = get_store()
    assert get_store() is parent_store
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report over the pipe and never return into pytest
        report: dict[str, object]
        try:
            os.close(read_fd)
            report = _child_report(parent_store)
        except BaseException:
            report = {"error": traceback.format_exc()}
        finally:
            os.write(write_fd, json.dumps(report).encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert "error" not in child, child["error"]
    assert child["new_store"] and child["cached"]
    assert f"opened in process {os.getpid()}" in child["refused"]
    assert get_store() is parent_store
    assert parent_store.get_task(child["task_id"]).state is TaskState.QUEUED


def _child_report(parent_store: WorkflowStore) -> dict[str, object]:
    child_store = get_store()
    try:
        parent_store.get_task("x")
        refused = ""
    except StoreUsedAcrossFork as exc:
        refused = str(exc)
    report = {
        "new_store": child_store is not parent_store,
        "cached": get_store() is child_store,
        "refused": refused,
        "task_id": enqueue("order-intake", 1, 1),
    }
    close_store()
    return report


def test_runworkflows_pool_runs_tasks_in_forked_workers_that_use_the_orm(
    url: str, store: SqliteWorkflowStore
) -> None:
    bodies = [post_order() for _ in range(3)]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runworkflows", "--concurrency", "2", "--worker-id", "dj"],
        cwd=EXAMPLE,
        env={**os.environ, "RUNIFOLD_DATABASE_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            if all(store.get_task(b["task_id"]).outcome is TaskOutcome.COMPLETED for b in bodies):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        processes.kill(proc)
    assert proc.returncode == 0, err
    assert "'completed': 3" in out and "restarts: 0" in out
    orders = Order.objects.filter(pk__in=[b["order_id"] for b in bodies])
    assert [o.status for o in orders] == ["confirmed"] * 3
