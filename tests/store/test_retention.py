"""Retention (``store.prune``) on every backend: finished tasks older than the cutoff go
with every row that belongs to them; unfinished tasks, tasks failed on an unresolved
ambiguous effect (unless asked), a parent with an unfinished child and a child whose
parent is still stored stay; a dry run counts without deleting; no batch holds more
tasks than asked; a pruned id enqueues a new task.

Tasks are driven through the store's own operations (claim, commit, fail, signal,
resolve) and aged by moving the store clock; rows are counted with the database's own
client, as an operator would."""

from __future__ import annotations

import re
import sqlite3
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument, TaskNotFound
from runifold_sync.model.checkpoint import JournalRow
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskState
from runifold_sync.store.open import sqlite_path
from runifold_sync.store.records import ClaimedTask
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
MONTH = timedelta(days=30)
OLD = timedelta(days=31)
# Every table with rows that belong to one task, and its task column.
BELONGING = (
    "runifold_events",
    "runifold_journal",
    "runifold_signals",
    "runifold_effect_resolutions",
    "runifold_task_events",
)


def _task(task_id: str, parent: str | None = None) -> WorkflowTask:
    task = WorkflowTask.new("orders", 1, {"order_id": task_id}, checkpoint_id=task_id)
    return task if parent is None else attrs.evolve(task, parent_id=parent)


def _claim(store: WorkflowStore, task_id: str) -> ClaimedTask:
    """Claim ``task_id``, the only task due (the others are finished or not yet due)."""
    (claimed,) = store.claim(W1, LEASE)
    assert claimed.lease.task_id == task_id
    return claimed


def _run(store: WorkflowStore, task_id: str, parent: str | None = None, *, fail: bool = False) -> None:
    """Enqueue ``task_id`` and finish it: completed, or failed."""
    store.enqueue(_task(task_id, parent))
    claimed = _claim(store, task_id)
    if fail:
        store.fail(claimed.lease, claimed.revision, "{}", reason="it broke")
    else:
        store.complete(claimed.lease, claimed.revision, "{}", "null")


def _run_fully(store: WorkflowStore, task_id: str) -> None:
    """A completed task with a row in every table that keeps rows per task: history,
    journal rows, a signal, an effect resolution (it failed on an ambiguous effect and an
    operator resolved it) and a published event."""
    store.enqueue(_task(task_id))
    store.send_signal(task_id, "approval", True, signal_id="s1", sender="alice")
    claimed = _claim(store, task_id)
    store.fail(claimed.lease, claimed.revision, "{}", reason="unknown outcome", ambiguous_effect="charge#1")
    store.resolve_effect(
        task_id, "charge#1", applied=True, result_json='"ch_1"', actor="ops", reason="checked the provider"
    )
    claimed = _claim(store, task_id)
    rows = [JournalRow("", n, to_json({"n": n})) for n in range(3)]
    store.commit_checkpoint(claimed.lease, claimed.revision, "{}", journal=rows)
    store.commit_event(claimed.lease, claimed.revision + 1, "{}", "progress", to_json({"done": 3}))
    store.complete(claimed.lease, claimed.revision + 2, "{}", "null")


def _waiting(store: WorkflowStore, task_id: str, parent: str | None = None) -> None:
    store.enqueue(_task(task_id, parent))
    claimed = _claim(store, task_id)
    store.suspend(claimed.lease, claimed.revision, "{}", wake_at=None, reason="wait", signal="go")


def _rows(backend: Backend, task_id: str) -> dict[str, int]:
    """How many rows each table holds for ``task_id`` (the task's own row included)."""
    tables = ("runifold_tasks", *BELONGING)
    counted: dict[str, int] = {}
    if backend.kind == "sqlite":
        with sqlite3.connect(sqlite_path(backend.url)) as conn:
            for table in tables:
                [(counted[table],)] = conn.execute(
                    f"SELECT count(*) FROM {table} WHERE task_id = ?", (task_id,)
                )
        return counted
    with psycopg.connect(backend.direct_url) as pg:
        for table in tables:
            [(counted[table],)] = pg.execute(
                f"SELECT count(*) FROM {table} WHERE task_id = %s".encode(), (task_id,)
            )
    return counted


def _stored(store: WorkflowStore, *task_ids: str) -> set[str]:
    found = set()
    for task_id in task_ids:
        try:
            store.get_task(task_id)
        except TaskNotFound:
            continue
        found.add(task_id)
    return found


def test_finished_tasks_older_than_the_cutoff_go_with_every_row_of_theirs(
    store: WorkflowStore, backend: Backend, clock: Clock
) -> None:
    _run_fully(store, "full")
    _run(store, "done")
    _run(store, "failed", fail=True)
    store.enqueue(_task("cancelled"))
    store.cancel("cancelled", "ops", "not needed")
    _waiting(store, "waiting")
    store.enqueue(attrs.evolve(_task("queued"), not_before=store.now() + 2 * OLD))
    store.enqueue(_task("leased"))
    clock.advance(OLD)
    _claim(store, "leased")
    _run(store, "recent")  # finished a moment ago
    full = _rows(backend, "full")
    assert all(full.values()), full  # a row in every table

    assert store.prune(MONTH) == 4

    assert _stored(store, "full", "done", "failed", "cancelled") == set()
    for task_id in ("full", "done", "failed", "cancelled"):
        assert set(_rows(backend, task_id).values()) == {0}, task_id
    assert _stored(store, "waiting", "leased", "queued", "recent") == {
        "waiting",
        "leased",
        "queued",
        "recent",
    }
    assert store.get_task("leased").state is TaskState.LEASED
    assert [e.kind for e in store.history("recent")] == ["enqueued", "claimed", "completed"]
    assert store.prune(MONTH) == 0


def test_a_task_failed_on_an_unresolved_ambiguous_effect_stays_unless_asked(
    store: WorkflowStore, clock: Clock
) -> None:
    store.enqueue(_task("unsure"))
    claimed = _claim(store, "unsure")
    store.fail(claimed.lease, claimed.revision, "{}", reason="unknown outcome", ambiguous_effect="charge#1")
    clock.advance(OLD)

    assert store.prune(MONTH) == 0
    assert store.prune(MONTH, dry_run=True, include_ambiguous=True) == 1
    assert store.get_task("unsure").ambiguous_effect == "charge#1"

    assert store.prune(MONTH, include_ambiguous=True) == 1
    assert _stored(store, "unsure") == set()


def test_the_cutoff_is_the_last_change_not_the_creation(store: WorkflowStore, clock: Clock) -> None:
    _waiting(store, "slow")
    clock.advance(OLD)  # created long ago, finished only now
    store.cancel("slow", "ops", "gave up")

    assert store.prune(MONTH) == 0
    clock.advance(OLD)
    assert store.prune(MONTH) == 1


def test_a_dry_run_counts_what_would_go_and_deletes_nothing(
    store: WorkflowStore, backend: Backend, clock: Clock
) -> None:
    for n in range(5):
        _run(store, f"t{n}")
    _waiting(store, "parent")
    _run(store, "child", parent="parent")  # kept: its parent is unfinished
    clock.advance(OLD)
    before = {f"t{n}": _rows(backend, f"t{n}") for n in range(5)}

    assert store.prune(MONTH, dry_run=True, batch=2) == 5
    assert store.prune(MONTH, dry_run=True) == 5

    assert {f"t{n}": _rows(backend, f"t{n}") for n in range(5)} == before
    assert store.prune(MONTH) == 5


def test_no_batch_deletes_more_tasks_than_asked(store: WorkflowStore, clock: Clock) -> None:
    for n in range(7):
        _run(store, f"t{n}")
    clock.advance(OLD)

    assert list(store.prune_batches(MONTH, batch=3, dry_run=True)) == [3, 3, 1]
    batches = store.prune_batches(MONTH, batch=3)
    assert next(batches) == 3
    assert len(_stored(store, *(f"t{n}" for n in range(7)))) == 4  # each batch commits on its own
    assert list(batches) == [3, 1]
    assert store.prune(MONTH, batch=3) == 0


def test_a_child_whose_parent_is_unfinished_stays(store: WorkflowStore, clock: Clock) -> None:
    _waiting(store, "parent")
    _run(store, "child", parent="parent")
    clock.advance(OLD)

    assert store.prune(MONTH) == 0
    assert _stored(store, "parent", "child") == {"parent", "child"}


def test_a_finished_parent_stays_until_its_children_have_finished_then_both_go(
    store: WorkflowStore, clock: Clock
) -> None:
    _run(store, "parent")  # it started a child and did not wait for it
    _waiting(store, "child", parent="parent")
    clock.advance(OLD)

    assert store.prune(MONTH) == 0
    store.cancel("child", "ops", "not needed")
    clock.advance(OLD)

    assert store.prune(MONTH, dry_run=True) == 2
    assert store.prune(MONTH) == 2  # the parent, then its child in the same prune
    assert _stored(store, "parent", "child") == set()


def test_a_child_stays_while_its_parent_is_stored_even_finished(store: WorkflowStore, clock: Clock) -> None:
    """An operator may requeue a failed parent, whose replay reads its children again."""
    store.enqueue(_task("parent"))
    _claim(store, "parent")
    _run(store, "child", parent="parent")
    clock.advance(OLD)
    parent = _claim(store, "parent")  # its lease expired meanwhile
    store.fail(parent.lease, parent.revision, "{}", reason="it broke")  # failed just now

    assert store.prune(MONTH) == 0
    clock.advance(OLD)
    assert store.prune(MONTH) == 2


def test_a_family_goes_in_one_prune_across_batches(store: WorkflowStore, clock: Clock) -> None:
    _run(store, "root")
    _run(store, "child", parent="root")
    _run(store, "grandchild", parent="child")
    _run(store, "other")
    clock.advance(OLD)

    assert list(store.prune_batches(MONTH, batch=1, dry_run=True)) == [1, 1, 1, 1, 0]
    assert list(store.prune_batches(MONTH, batch=2)) == [2, 2, 0]
    assert _stored(store, "root", "child", "grandchild", "other") == set()


def test_a_pruned_task_id_enqueues_a_new_task(store: WorkflowStore, clock: Clock) -> None:
    _run(store, "again")
    assert store.enqueue(_task("again")).created is False
    clock.advance(OLD)
    assert store.prune(MONTH) == 1

    assert store.enqueue(_task("again")).created is True
    record = store.get_task("again")
    assert record.state is TaskState.QUEUED
    assert [e.kind for e in store.history("again")] == ["enqueued"]


def test_older_than_zero_takes_everything_finished(store: WorkflowStore) -> None:
    _run(store, "done")
    store.enqueue(_task("queued"))

    assert store.prune(timedelta(0)) == 1
    assert _stored(store, "done", "queued") == {"queued"}


BAD: list[tuple[dict[str, Any], str]] = [
    ({"older_than": timedelta(days=-1)}, "older_than must be non-negative, got"),
    ({"older_than": 30}, "older_than must be a datetime.timedelta, got 30"),
    ({"older_than": timedelta(days=4000)}, "older_than must be at most"),
    ({"older_than": MONTH, "batch": 0}, "prune batch must be an integer in 1..10000, got 0"),
    ({"older_than": MONTH, "batch": True}, "prune batch must be an integer in 1..10000, got True"),
    ({"older_than": MONTH, "batch": 10_001}, "prune batch must be an integer in 1..10000"),
    ({"older_than": MONTH, "include_ambiguous": "yes"}, "include_ambiguous must be True or False"),
    ({"older_than": MONTH, "dry_run": 1}, "dry_run must be True or False, got 1"),
]


@pytest.mark.parametrize(("arguments", "message"), BAD)
def test_bad_arguments_are_refused_naming_the_value(
    store: WorkflowStore, arguments: dict[str, Any], message: str
) -> None:
    arguments = dict(arguments)
    older_than = arguments.pop("older_than")
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        store.prune(older_than, **arguments)
    with pytest.raises(InvalidArgument):
        store.prune_batches(older_than, **arguments)  # at the call, not at the first batch
