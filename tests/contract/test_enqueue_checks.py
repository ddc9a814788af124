"""``enqueue`` checks every field of each task it is given, as ``WorkflowTask.new``
checks its arguments: a task built directly or changed with ``attrs.evolve`` used to
reach the database unchecked, where SQLite kept input that is not JSON (its worker then
crash-looped), a float priority or an int tenant, and PostgreSQL rounded the priority or
took a naive ``not_before``. Refused alike on both stores, naming the field, and nothing
of the batch is written."""

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
        ({"input_json": "{"}, "input_json"),
        ({"input_json": '{"n": NaN}'}, "input_json"),
        ({"input_json": 5}, "input_json"),
        ({"input_json": '"\\u0000"'}, "input_json"),
        ({"input_json": "[" * 200 + "]" * 200}, "input_json"),
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
def test_a_changed_task_is_refused_naming_the_field_and_nothing_is_written(
    store: WorkflowStore, change: dict[str, Any], named: str
) -> None:
    bad = attrs.evolve(GOOD, **({"task_id": "bad"} | change))
    for call in (lambda: store.enqueue(bad), lambda: store.enqueue_many([GOOD, bad])):
        with pytest.raises(InvalidArgument, match=named):
            call()
    assert store.list_tasks() == []


def test_a_task_built_directly_is_checked_too(store: WorkflowStore) -> None:
    bad = WorkflowTask("t", "orders", 1, "{}", "acme", 1.5, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="priority"):
        store.enqueue(bad)
    assert store.list_tasks() == []


def test_input_text_is_kept_in_canonical_form_on_both_stores(store: WorkflowStore) -> None:
    """What ``WorkflowTask.new`` would have made of the value: both backends read back
    the same text, and a good task built by hand is accepted."""
    task = attrs.evolve(GOOD, input_json='{ "b": [1, 2],  "a": "x" }')
    task = attrs.evolve(task, not_before=datetime(2020, 1, 1, tzinfo=UTC))
    assert store.enqueue(task).created
    assert store.get_task("good").input_json == '{"a":"x","b":[1,2]}'
    assert store.enqueue(task).created is False  # the same task again: idempotent
