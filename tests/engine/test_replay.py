"""The replay rule (``runifold_sync/engine/replay.py``) and the engine that commits by it.

A recorded call returns its output without running; the first new call runs and is
recorded at the cursor, then committed; a journal that records another call at a
position fails closed; each parallel branch walks its own journal with its own call ids.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.engine.claim import Claim
from runifold_sync.engine.interrupts import FailRequested
from runifold_sync.engine.replay import Cursor, finished
from runifold_sync.engine.task_run import TaskRun
from runifold_sync.errors import CheckpointError
from runifold_sync.model.checkpoint import MAIN, Checkpoint, EntryKind, EntryStatus, JournalEntry, JournalRow
from runifold_sync.model.values import DefinitionIdentity
from runifold_sync.store.checkpoints import read_checkpoint

IDENTITY = DefinitionIdentity("replayed", 1, "f" * 16)


def _done(call_id: str, output: Any, kind: EntryKind = EntryKind.STEP) -> JournalEntry:
    return JournalEntry(call_id, kind, EntryStatus.DONE, output)


def _cursor(*entries: JournalEntry) -> Cursor:
    return Cursor(Checkpoint(IDENTITY, journal=list(entries)), threading.RLock(), "t1")


# --- the cursor ---------------------------------------------------------------------------


def test_the_cursor_hands_out_recorded_entries_in_call_order_and_moves_past_finished_ones() -> None:
    recorded = [_done("a#1", 1), _done("b#1", {"x": 2}), _done("a#2", [3])]
    cursor = _cursor(*recorded)
    assert [cursor.take("a", EntryKind.STEP), cursor.take("b", EntryKind.STEP)] == [
        ("a#1", recorded[0]),
        ("b#1", recorded[1]),
    ]
    assert cursor.take("a", EntryKind.STEP) == ("a#2", recorded[2])  # the second call of a
    assert cursor.position == 3
    assert cursor.take("a", EntryKind.STEP) == ("a#3", None)  # past the end: a new call


def test_a_new_call_is_recorded_at_the_cursor() -> None:
    cursor = _cursor(_done("a#1", 1))
    cursor.take("a", EntryKind.STEP)
    call_id, recorded = cursor.take("a", EntryKind.STEP)
    assert (call_id, recorded) == ("a#2", None)
    cursor.record(_done(call_id, 2))
    assert [(e.call_id, e.output) for e in cursor.journal] == [("a#1", 1), ("a#2", 2)]
    assert cursor.position == 2


@pytest.mark.parametrize(
    ("recorded", "why"),
    [(_done("b#1", 1), "another call id"), (_done("a#1", 1, EntryKind.EFFECT), "another kind")],
)
def test_a_recorded_entry_of_another_call_fails_closed(recorded: JournalEntry, why: str) -> None:
    with pytest.raises(FailRequested) as caught:
        _cursor(recorded).take("a", EntryKind.STEP)
    assert caught.value.cause == "nondeterminism", why
    assert caught.value.reason == (
        f"task 't1' replay diverged at call 0: the checkpoint recorded {recorded.call_id!r} but the "
        "workflow asked for 'a#1'"
    )


def test_an_unfinished_entry_stays_under_the_cursor_until_it_is_finished() -> None:
    intent = JournalEntry("pay#1", EntryKind.EFFECT, EntryStatus.INTENT, key="t1/pay#1")
    cursor = _cursor(intent)
    assert cursor.take("pay", EntryKind.EFFECT) == ("pay#1", intent)
    assert not finished(intent)
    assert cursor.position == 0
    cursor.finish(intent, {"id": 7}, "reconciled")
    assert (intent.status, intent.output, intent.evidence, cursor.position) == (
        "done",
        {"id": 7},
        "reconciled",
        1,
    )
    assert finished(intent)
    assert cursor.take("pay", EntryKind.EFFECT) == ("pay#2", None)


def test_a_begun_entry_can_be_taken_back_as_if_never_called() -> None:
    cursor = _cursor()
    call_id, recorded = cursor.take("pay", EntryKind.EFFECT)
    assert recorded is None
    entry = JournalEntry(call_id, EntryKind.EFFECT, EntryStatus.INTENT)
    cursor.begin(entry)
    assert cursor.journal == [entry] and cursor.position == 0
    cursor.drop(entry)
    assert cursor.journal == []


def test_each_branch_walks_its_own_journal_with_call_ids_scoped_by_its_key() -> None:
    checkpoint = Checkpoint(IDENTITY)
    lock = threading.RLock()
    for key in ("parallel#1/left", "parallel#1/right"):
        cursor = Cursor(checkpoint, lock, "t1", key)
        call_id, _ = cursor.take("add", EntryKind.STEP)
        cursor.record(_done(call_id, key))
    assert checkpoint.journal == []
    assert {
        key: [(e.call_id, e.output) for e in journal] for key, journal in checkpoint.branch_journals.items()
    } == {
        "parallel#1/left": [("parallel#1/left/add#1", "parallel#1/left")],
        "parallel#1/right": [("parallel#1/right/add#1", "parallel#1/right")],
    }
    again = Cursor(checkpoint, lock, "t1", "parallel#1/left")  # the next claim
    assert again.take("add", EntryKind.STEP) == (
        "parallel#1/left/add#1",
        checkpoint.branch_journals[again.scope][0],
    )


def test_entry_kinds_and_statuses_are_stored_as_their_names_and_decoded_as_enums() -> None:
    entry = JournalEntry("t#1", EntryKind.TIMER, EntryStatus.DONE, due=1.5)
    write = Checkpoint(IDENTITY, journal=[entry]).write("t1", 1 << 20)
    stored = (
        '{"call_id":"t#1","due":1.5,"evidence":null,"key":null,"kind":"timer","output":null,"status":"done"}'
    )
    assert f'"journal_tail":{{"":{{"entries":[{stored}],"start":0}}}}' in write.head_json
    decoded = Checkpoint.decode("t1", write.head_json).journal[0]
    assert decoded.kind is EntryKind.TIMER and decoded.status is EntryStatus.DONE
    assert decoded == entry


@pytest.mark.parametrize(("field", "value"), [("kind", "sleep"), ("status", "halfway"), ("kind", ["step"])])
def test_an_unknown_entry_kind_or_status_is_a_corrupt_checkpoint(field: str, value: Any) -> None:
    write = Checkpoint(IDENTITY, journal=[_done("a#1", 1)]).write("t1", 1 << 20)
    raw = json.loads(write.head_json)
    raw["journal_tail"][MAIN]["entries"][0][field] = value
    with pytest.raises(CheckpointError, match="checkpoint of task 't1' is corrupt"):
        Checkpoint.decode("t1", json.dumps(raw))
    row = dict(raw["journal_tail"].pop(MAIN)["entries"][0])  # the same entry as a row
    with pytest.raises(CheckpointError, match="checkpoint of task 't1' is corrupt"):
        Checkpoint.decode("t1", json.dumps(raw), [JournalRow(MAIN, 0, json.dumps(row))])


# --- the engine: recorded calls replay, the first new one runs and commits -----------------

RAN: list[str] = []
replayed = Workflow("replayed", 1)


@replayed.step()
def add(ctx: StepContext, n: int) -> int:
    RAN.append(ctx.call_id)
    return n + 1


@replayed.step()
def listed(ctx: StepContext, n: int) -> Any:
    RAN.append(ctx.call_id)
    return {"items": list(range(n))}


@replayed.main
def main(ctx: WorkflowContext, n: int) -> int:
    return add(ctx, add(ctx, n))


@pytest.fixture
def start(store: WorkflowStore) -> Iterator[Any]:
    """A TaskRun of a claimed task over ``journal``, as the worker makes one."""
    definition = WorkflowDefinition(replayed)
    store.enqueue(WorkflowTask.new("replayed", 1, 1, checkpoint_id="r1"))
    (claimed,) = store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    RAN.clear()

    def make(*journal: JournalEntry) -> TaskRun:
        current = attrs.evolve(claimed, revision=store.get_task("r1").revision)  # as a new claim reads it
        claim = Claim(current, deadline=time.monotonic() + 30)
        return TaskRun.open(claim, definition, Checkpoint(definition.identity, journal=list(journal)), store)

    yield make


def _stored(store: WorkflowStore) -> list[tuple[str, Any]]:
    checkpoint = read_checkpoint(store, "r1")
    assert checkpoint is not None
    return [(e.call_id, e.output) for e in checkpoint.journal]


def test_recorded_steps_return_their_outputs_in_order_without_running(
    store: WorkflowStore, start: Any
) -> None:
    run = start(_done("add#1", 20), _done("add#2", 30))
    assert [add(run.context, 1), add(run.context, 2)] == [20, 30]  # the recorded outputs
    assert RAN == []
    assert run.revision == 0 and store.get_task("r1").checkpoint_json is None  # nothing written


def test_the_first_new_step_runs_and_is_committed_before_the_next_body(
    store: WorkflowStore, start: Any
) -> None:
    run = start(_done("add#1", 2))
    assert add(run.context, 1) == 2
    assert add(run.context, 2) == 3
    assert RAN == ["add#2"]
    assert store.get_task("r1").checkpoint_json is None  # held back until the next boundary
    assert add(run.context, 3) == 4  # committed before this body ran
    assert _stored(store) == [("add#1", 2), ("add#2", 3)]
    run.commit()
    assert RAN == ["add#2", "add#3"]
    assert _stored(store) == [("add#1", 2), ("add#2", 3), ("add#3", 4)]
    assert store.get_task("r1").revision == run.revision == 2


def test_changing_an_output_in_the_main_function_leaves_the_journal_as_the_step_returned_it(
    store: WorkflowStore, start: Any
) -> None:
    run = start(_done("listed#1", {"items": [0]}))
    replayed_value = listed(run.context, 1)
    replayed_value["items"].append("changed by the main function")
    fresh = listed(run.context, 2)
    fresh["items"].append("changed by the main function")
    assert RAN == ["listed#2"]
    run.commit()
    # Written by the commit after both changes: what the steps returned, as a replay gives back.
    assert _stored(store) == [("listed#1", {"items": [0]}), ("listed#2", {"items": [0, 1]})]


def test_a_journal_that_recorded_another_step_fails_the_replay_closed(start: Any) -> None:
    run = start(_done("other#1", 2))
    with pytest.raises(FailRequested) as caught:
        add(run.context, 1)
    assert caught.value.cause == "nondeterminism"
    assert "recorded 'other#1' but the workflow asked for 'add#1'" in caught.value.reason
    assert RAN == []


def test_parallel_branches_replay_from_their_own_journals(store: WorkflowStore, start: Any) -> None:
    def branch(n: int) -> Any:
        return lambda ctx: add(ctx, n)

    run = start()
    assert run.context.parallel({"a": branch(1), "b": branch(10)}) == {"a": 2, "b": 11}
    assert sorted(RAN) == ["parallel#1/a/add#1", "parallel#1/b/add#1"]
    stored = read_checkpoint(store, "r1")
    assert stored is not None
    assert [(e.call_id, e.status, e.output) for e in stored.journal] == [
        ("parallel#1", "done", {"a": 2, "b": 11})
    ]
    assert {key: [e.call_id for e in journal] for key, journal in stored.branch_journals.items()} == {
        "parallel#1/a": ["parallel#1/a/add#1"],
        "parallel#1/b": ["parallel#1/b/add#1"],
    }
    # Only branch a finished before a crash: the next claim replays a and runs b.
    RAN.clear()
    again = start(JournalEntry("parallel#1", EntryKind.PARALLEL, EntryStatus.PENDING, {"a": 2}))
    again.checkpoint.branch_journals["parallel#1/a"] = [_done("parallel#1/a/add#1", 2)]
    assert again.context.parallel({"a": branch(1), "b": branch(10)}) == {"a": 2, "b": 11}
    assert RAN == ["parallel#1/b/add#1"]
