"""A WorkflowTask checks every field where it is made (``WorkflowTask.new``, the class
called directly, ``attrs.evolve``), naming the field: a task built by hand used to reach
the database unchecked, where SQLite kept a float priority or an int tenant and
PostgreSQL rounded the priority or took a naive ``not_before``. So ``enqueue`` checks
only that it is given WorkflowTasks, and nothing of a refused batch is written."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import attrs
import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument

GOOD = WorkflowTask.new("orders", 1, {"n": 1}, checkpoint_id="good")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"input_json": 5}, "input_json"),
        ({"priority": 1.5}, "priority"),
        ({"priority": 2**63}, "priority"),
        ({"priority": True}, "priority"),
        ({"tenant": 5}, "tenant"),
        ({"tenant": ""}, "tenant"),
        ({"not_before": datetime(2030, 1, 1)}, "not_before"),
        ({"not_before": "2030-01-01"}, "not_before"),
        ({"queue": None}, "queue"),
        ({"definition_name": "a\nb"}, "workflow name"),
        ({"definition_version": 0}, "version"),
        ({"definition_version": "1"}, "version"),
        ({"task_id": 5}, "task id"),
        ({"task_id": " x"}, "task id"),
        ({"parent_id": 5}, "parent id"),
        ({"declared": "nope"}, "declared"),
    ],
)
def test_a_changed_task_is_refused_where_it_is_made_naming_the_field(
    change: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidArgument, match=named):
        attrs.evolve(GOOD, **({"task_id": "bad"} | change))


def test_a_task_built_directly_is_checked_too() -> None:
    with pytest.raises(InvalidArgument, match="priority"):
        WorkflowTask("t", "orders", 1, "{}", "acme", 1.5, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [[GOOD, "not a task"], [GOOD, GOOD], (GOOD,)])
def test_enqueue_refuses_what_is_not_a_list_of_distinct_tasks_and_writes_nothing(
    store: WorkflowStore, batch: Any
) -> None:
    with pytest.raises(InvalidArgument):
        store.enqueue_many(batch)
    assert store.list_tasks() == []


def test_input_text_is_kept_as_the_task_holds_it(store: WorkflowStore) -> None:
    """``WorkflowTask.new`` made the text canonical; the store keeps it as it is, so both
    backends read back the same text, and a good task built by hand is accepted."""
    task = attrs.evolve(GOOD, not_before=datetime(2020, 1, 1, tzinfo=UTC))
    assert store.enqueue(task).created
    assert store.get_task("good").input_json == '{"n":1}'
    assert store.enqueue(task).created is False  # the same task again: idempotent
