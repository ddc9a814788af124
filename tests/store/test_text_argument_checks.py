"""The filters of ``list_tasks``/``list_tasks_page`` and every id, key and name a store
method looks up are checked alike on both stores: a filter of another type matched
nothing silently (``tenant=5``) or failed in the driver (``tenant=["a"]``, an outage on
SQLite), a lone surrogate was a bare ``UnicodeEncodeError`` on both, and a NUL was
``TaskNotFound`` on SQLite but a refused value on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

FILTERS = ["tenant", "definition", "parent", "queue"]


@pytest.fixture(autouse=True)
def _one_task(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1", tenant="acme"))


@pytest.mark.parametrize("bad", [5, ["acme"], "", " acme", "a\x00b", "\ud800"])
@pytest.mark.parametrize("field", FILTERS)
def test_a_list_filter_that_is_not_a_name_is_refused_naming_it(
    store: WorkflowStore, field: str, bad: object
) -> None:
    for call in (
        lambda: store.list_tasks(**{field: bad}),  # type: ignore[arg-type]
        lambda: store.list_tasks_page(**{field: bad}),  # type: ignore[misc]
    ):
        with pytest.raises(InvalidArgument, match=field):
            call()


def test_a_list_filter_naming_a_task_field_still_matches(store: WorkflowStore) -> None:
    assert [t.task_id for t in store.list_tasks(tenant="acme", definition="orders", queue="default")] == [
        "t1"
    ]
    assert store.list_tasks(tenant="other") == []


TEXT_CALLS: dict[str, Callable[[WorkflowStore, str], object]] = {
    "task id": lambda s, bad: s.get_task(bad),
    "task id ": lambda s, bad: s.wait_for_task(bad, timedelta(0)),
    "task id  ": lambda s, bad: s.send_signal(bad, "go", 1, signal_id="s", sender="a"),
    "task id   ": lambda s, bad: s.history(bad),
    "effect key": lambda s, bad: s.resolve_effect(
        "t1", bad, applied=False, result_json=None, actor="ops", reason="r"
    ),
    "event key": lambda s, bad: s.get_event("t1", bad),
    "task page cursor": lambda s, bad: s.list_tasks_page(after=f"2024-01-01T00:00:00+00:00|{bad}"),
    "schedule name": lambda s, bad: s.schedule(bad),
}


@pytest.mark.parametrize("bad", ["\ud800", "x\udfffy", "a\x00b"])
@pytest.mark.parametrize("field", sorted(TEXT_CALLS))
def test_an_id_no_store_can_hold_is_refused_naming_its_field(
    store: WorkflowStore, field: str, bad: Any
) -> None:
    with pytest.raises(InvalidArgument, match=field.strip()):
        TEXT_CALLS[field](store, bad)
