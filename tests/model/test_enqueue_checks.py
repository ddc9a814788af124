"""A WorkflowTask checks every field where it is made (``WorkflowTask.new``, the class
called directly, ``attrs.evolve``), naming the field: a task built by hand used to reach
the database unchecked, where SQLite kept input that is not JSON (its worker then
crash-looped), a float priority or an int tenant, and PostgreSQL rounded the priority or
took a naive ``not_before``. Its input must be canonical JSON text, so both stores keep
and hand back the same text. So ``enqueue`` checks only that it is given WorkflowTasks,
and nothing of a refused batch is written."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import attrs
import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument
from runifold_sync.model import validate
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

GOOD = WorkflowTask.new("orders", 1, {"n": 1}, checkpoint_id="good")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"input_json": 5}, "input_json must be a string, got 5"),
        ({"input_json": "{"}, "input_json must be JSON text"),
        ({"input_json": '{"n": NaN}'}, "input_json is not JSON-serializable"),
        ({"input_json": '"\\u0000"'}, "input_json is not JSON-serializable"),
        ({"input_json": "[" * 200 + "]" * 200}, "input_json nests"),
        ({"input_json": '{ "n": 1 }'}, "input_json must be canonical JSON text"),
        ({"input_json": '{"b":1,"a":2}'}, "input_json must be canonical JSON text"),
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
    with pytest.raises(InvalidArgument, match=r"^input_json must be JSON text \(.*\), got 'not json'$"):
        WorkflowTask("t", "orders", 1, "not json", "acme", 0, None)
    with pytest.raises(InvalidArgument, match=r"^input_json must be canonical JSON text .*, got '\[1, 2\]'$"):
        WorkflowTask("t", "orders", 1, "[1, 2]", "acme", 0, None)
    assert WorkflowTask("t", "orders", 1, "[1,2]", "acme", 0, None).input_json == "[1,2]"


def test_input_text_is_decoded_once_per_task_made_or_changed_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """``WorkflowTask.new`` makes the text canonical itself, and ``WorkflowTask.evolve``
    keeps text checked when the task was made: neither decodes it again. Text given by
    hand (the class called, ``attrs.evolve``) is checked each time."""
    checked: list[object] = []
    real = validate.canonical_json

    def counting(field: str, value: object, *, limit: int) -> str:
        checked.append(value)
        return real(field, value, limit=limit)

    monkeypatch.setattr(validate, "canonical_json", counting)
    task = WorkflowTask.new("orders", 1, {"n": 2}, checkpoint_id="t", priority=3)
    later = task.evolve(priority=4, queue="slow")
    assert (later.input_json, later.priority, checked) == ('{"n":2}', 4, [])
    attrs.evolve(task, priority=5)
    WorkflowTask("u", "orders", 1, "[]", "acme", 0, None)
    task.evolve(input_json='{"n":3}')
    assert checked == ['{"n":2}', "[]", '{"n":3}']
    with pytest.raises(InvalidArgument, match="input_json must be JSON text"):
        task.evolve(input_json="{")


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
