"""The store in Django's own database (``RUNIFOLD_DATABASE = "default"``), driven through
the example project, on whichever database ``tests.contrib.django_settings`` gives Django
(SQLite, or PostgreSQL when ``RUNIFOLD_TEST_DJANGO_PG_URL`` is set).

Not collected by the main run: ``test_django.py`` runs this file once per database in a
subprocess. Transactions here are real (no test case wraps them).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import django
import pytest

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from shop.models import Order  # noqa: E402

from runifold_sync import TaskNotFound, TaskState, WorkflowStore, open_store  # noqa: E402
from runifold_sync.contrib.django import close_store, get_store  # noqa: E402
from runifold_sync.contrib.django.database import store_url  # noqa: E402

pytestmark = pytest.mark.timeout(60)


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
