"""The example through Django's own test runner: ``python manage.py test``.

``TransactionTestCase`` commits for real, so ``enqueue_on_commit`` runs exactly when
Django would run it in production. Each test gets a store file of its own.
"""

import io
import json
import tempfile
from pathlib import Path

from django.core.management import call_command
from django.test import TransactionTestCase, override_settings

from runifold_sync.contrib.django import close_store, get_store
from runifold_sync.store import TaskOutcome, TaskState

from .models import Order


class OrderWorkflowTests(TransactionTestCase):
    def setUp(self) -> None:
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        store_url = f"sqlite:///{Path(directory.name) / 'workflows.db'}"
        settings = override_settings(RUNIFOLD_DATABASE_URL=store_url)
        settings.enable()
        self.addCleanup(settings.disable)
        self.addCleanup(close_store)

    def test_a_committed_order_is_enqueued_and_runworkflows_once_confirms_it(self) -> None:
        response = self.client.post(
            "/orders/", json.dumps({"sku": "tea", "quantity": 2}), content_type="application/json"
        )
        self.assertEqual(response.status_code, 202)
        task_id = response.json()["task_id"]
        self.assertIs(get_store().get_task(task_id).state, TaskState.QUEUED)

        call_command("runworkflows", "--once", stdout=io.StringIO())

        record = get_store().get_task(task_id)
        self.assertEqual((record.state, record.outcome), (TaskState.TERMINAL, TaskOutcome.COMPLETED))
        self.assertEqual(record.result, "confirmed")
        order = Order.objects.get(pk=response.json()["order_id"])
        self.assertEqual(order.status, "confirmed")

    def test_runworkflows_once_with_nothing_queued_is_idle_and_succeeds(self) -> None:
        out = io.StringIO()
        call_command("runworkflows", "--once", stdout=out)
        self.assertEqual(out.getvalue().strip(), "Idle()")
