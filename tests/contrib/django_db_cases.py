"""The store in Django's own database (``RUNIFOLD_DATABASE = "default"``), driven through
the example project, on whichever database ``tests.contrib.django_settings`` gives Django
(SQLite, or PostgreSQL when ``RUNIFOLD_TEST_DJANGO_PG_URL`` is set).

Not collected by the main run: ``test_django.py`` runs this file once per database in a
subprocess. Transactions here are real (no test case wraps them).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import django
import pytest

django.setup()

from django.core.management import CommandError, call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from shop.models import Order  # noqa: E402

from runifold_sync import (  # noqa: E402
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    open_store,
)
from runifold_sync.contrib.django import close_store, get_store  # noqa: E402
from runifold_sync.contrib.django.database import store_url  # noqa: E402
from runifold_sync.errors import InvalidArgument, TaskNotFound  # noqa: E402
from runifold_sync.store import TaskState  # noqa: E402
from runifold_sync.testing import run_until_idle  # noqa: E402

pytestmark = pytest.mark.timeout(60)

# A workflow whose transaction step writes with the ORM: ``runworkflows --once`` runs it
# in this process (RUNIFOLD_APP below), so BODY_RUNS counts every run of its body.
APP = "tests.contrib.django_db_cases:registry"
BODY_RUNS: list[int] = []
payment = Workflow("django-payment", 1, signals=["shipped"])


@payment.transaction()
def mark_paid(ctx: StepContext, order: dict[str, Any]) -> bool:
    BODY_RUNS.append(order["id"])
    Order.objects.filter(pk=order["id"]).update(status="paid")
    if order.get("lose_lease"):  # another worker took the task: the fenced commit must fail
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE runifold_tasks SET fencing_token = fencing_token + 1 WHERE task_id = %s",
                [ctx.task_id],
            )
    return ctx.connection is connection.connection  # the step runs on Django's own connection


@payment.main
def pay(ctx: WorkflowContext, order: dict[str, Any]) -> bool:
    on_django = mark_paid(ctx, order)
    ctx.wait_for_signal("shipped")  # a second cycle replays mark_paid
    return on_django


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(payment))


class Rollback(Exception):
    pass


@pytest.fixture(scope="module", autouse=True)
def django_tables() -> None:
    call_command("migrate", verbosity=0)


@pytest.fixture
def store() -> Iterator[WorkflowStore]:
    """The store in Django's database: opened (and migrated) first, as a worker's start
    would, and a second store on it to look at what the integration did."""
    with override_settings(RUNIFOLD_DATABASE="default"):
        get_store()
        s = open_store(store_url("default"))
        yield s
        s.close()
        close_store()


def task_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM runifold_tasks")
        count: int = cursor.fetchone()[0]
    return count


def post_order() -> dict[str, str]:
    response = Client().post("/orders/", {"sku": "tea", "quantity": 2}, content_type="application/json")
    assert response.status_code == 202, response.content
    body: dict[str, str] = response.json()
    return body


def test_a_rolled_back_view_leaves_no_task(store: WorkflowStore) -> None:
    before = task_count()
    with pytest.raises(Rollback), transaction.atomic():
        body = post_order()
        assert task_count() == before + 1  # written on Django's connection, in this transaction
        raise Rollback
    assert task_count() == before
    with pytest.raises(TaskNotFound):
        store.get_task(body["task_id"])


def test_a_committed_view_leaves_one_task_that_runworkflows_runs(store: WorkflowStore) -> None:
    before = task_count()
    with transaction.atomic():
        body = post_order()
    assert task_count() == before + 1
    assert store.get_task(body["task_id"]).state is TaskState.QUEUED
    out = io.StringIO()
    call_command("runworkflows", "--once", stdout=out)
    assert out.getvalue().startswith(f"Completed(task_id='{body['task_id']}'")
    assert Order.objects.get(pk=body["order_id"]).status == "confirmed"


def test_manage_py_check_warns_when_the_stores_schema_is_behind(store: WorkflowStore) -> None:
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "runifold.W001" not in out.getvalue()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM runifold_schema WHERE version = (SELECT MAX(version) FROM runifold_schema)"
            )
        out = io.StringIO()
        call_command("check", stdout=out, stderr=out)
        transaction.set_rollback(True)
    assert "runifold.W001" in out.getvalue() and "schema version" in out.getvalue()


def _order(store: WorkflowStore, **extra: Any) -> tuple[Order, str]:
    order = Order.objects.create(sku="tea", quantity=1)
    task = store.enqueue(WorkflowTask.new("django-payment", 1, {"id": order.pk, **extra})).task_id
    return order, task


def _run_once() -> str:
    out = io.StringIO()
    with override_settings(RUNIFOLD_APP=APP):
        call_command("runworkflows", "--once", stdout=out)
    return out.getvalue()


def test_a_transaction_step_writes_with_the_orm_in_its_checkpoints_transaction_and_replays_without_running(
    store: WorkflowStore,
) -> None:
    BODY_RUNS.clear()
    order, task_id = _order(store)
    assert _run_once().startswith(f"Suspended(task_id='{task_id}'")
    order.refresh_from_db()
    assert order.status == "paid" and BODY_RUNS == [order.pk]
    store.send_signal(task_id, "shipped", None, signal_id=f"shipped-{task_id}", sender="test")
    assert _run_once().startswith(f"Completed(task_id='{task_id}'")
    assert BODY_RUNS == [order.pk], "replay ran the body again"
    assert store.get_task(task_id).result is True  # ctx.connection was Django's connection


def test_a_fence_failure_rolls_back_the_steps_orm_write_with_its_checkpoint(store: WorkflowStore) -> None:
    BODY_RUNS.clear()
    order, task_id = _order(store, lose_lease=True)
    token = store.get_task(task_id).fencing_token
    with pytest.raises(CommandError, match="lease_lost"):
        _run_once()
    order.refresh_from_db()
    assert BODY_RUNS == [order.pk] and order.status == "new"
    leased = store.get_task(task_id)
    # The token bump rolled back with the ORM write: only the claim raised it.
    assert leased.fencing_token == token + 1 and leased.revision == 0


def test_run_until_idle_on_get_store_runs_transaction_steps_on_djangos_connection(
    store: WorkflowStore,
) -> None:
    BODY_RUNS.clear()
    order, task_id = _order(get_store())
    get_store().send_signal(task_id, "shipped", None, signal_id=f"shipped-{task_id}", sender="test")
    run_until_idle(get_store(), registry)
    order.refresh_from_db()
    assert order.status == "paid" and store.get_task(task_id).result is True


def test_a_view_that_opens_the_store_inside_its_write_transaction_enqueues_at_once() -> None:
    """The first request of a process opens the store from inside its own transaction,
    which on SQLite (transaction_mode IMMEDIATE) already holds the write lock: opening a
    store whose schema is current only reads, so it does not wait for that lock."""
    with override_settings(RUNIFOLD_DATABASE="default"):
        open_store(store_url("default")).close()  # migrated, as a deploy's migrate leaves it
        close_store()  # this process has not opened its store yet
        before = task_count()
        try:
            with transaction.atomic():
                body = post_order()
            assert task_count() == before + 1
            assert get_store().get_task(body["task_id"]).state is TaskState.QUEUED
        finally:
            close_store()


def test_an_in_memory_django_database_is_refused_naming_the_test_setting_to_give_it() -> None:
    name = "file:memorydb_default?mode=memory&cache=shared"  # what Django's test runner gives
    memory = {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    with override_settings(DATABASES={"default": memory}):
        with pytest.raises(InvalidArgument, match=r"in memory .*\['TEST'\] = \{'NAME'"):
            store_url("default")
