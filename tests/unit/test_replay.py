"""The replay rule (``runifold_sync/replay.py``) and the engine that commits by it.

A recorded call returns its output without running; the first new call runs and is
recorded at the cursor, then committed; a journal that records another call at a
position fails closed; each parallel branch walks its own journal with its own call ids.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

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
from runifold_sync.checkpoint import Checkpoint, EntryKind, EntryStatus, JournalEntry
from runifold_sync.engine import TaskRun
from runifold_sync.heartbeat import LeaseFlags
from runifold_sync.interrupts import FailRequested
from runifold_sync.models import DefinitionIdentity
from runifold_sync.replay import Cursor, replay_or_run

IDENTITY = DefinitionIdentity("replayed", 1, "f" * 16)


def _done(call_id: str, output: Any, kind: EntryKind = EntryKind.STEP) -> JournalEntry:
    return JournalEntry(call_id, kind, EntryStatus.DONE, output)


def _cursor(*entries: JournalEntry) -> Cursor:
    return Cursor(list(entries), threading.RLock(), "t1")


class Runs:
    """A step body that says what it ran, and a save that says what it was handed."""

    def __init__(self, cursor: Cursor) -> None:
        self.cursor = cursor
        self.ran: list[str] = []
        self.saved: list[JournalEntry] = []

    def run(self, call_id: str) -> Any:
        self.ran.append(call_id)
        return f"new {call_id}"

    def save(self, entry: JournalEntry) -> None:
        assert self.cursor.lock._is_owned()  # type: ignore[attr-defined]  # under the journal lock
        self.saved.append(entry)

    def step(self, name: str) -> tuple[Any, bool]:
        return replay_or_run(self.cursor, name, EntryKind.STEP, self.run, self.save)


# --- the cursor and the rule -------------------------------------------------------------


def test_recorded_calls_return_their_outputs_in_order_without_running() -> None:
    runs = Runs(_cursor(_done("a#1", 1), _done("b#1", {"x": 2}), _done("a#2", [3])))
    assert [runs.step("a"), runs.step("b"), runs.step("a")] == [(1, False), ({"x": 2}, False), ([3], False)]
    assert runs.ran == [] and runs.saved == []
    assert runs.cursor.position == 3


def test_the_first_unrecorded_call_runs_and_is_recorded_and_saved() -> None:
    runs = Runs(_cursor(_done("a#1", 1)))
    assert runs.step("a") == (1, False)
    assert runs.step("a") == ("new a#2", True)
    assert runs.step("b") == ("new b#1", True)
    assert runs.ran == ["a#2", "b#1"]
    assert runs.saved == runs.cursor.journal[1:]
    assert [(e.call_id, e.kind, e.status, e.output) for e in runs.cursor.journal] == [
        ("a#1", "step", "done", 1),
        ("a#2", "step", "done", "new a#2"),
        ("b#1", "step", "done", "new b#1"),
    ]
    assert runs.cursor.position == 3


@pytest.mark.parametrize(
    ("recorded", "why"),
    [(_done("b#1", 1), "another call id"), (_done("a#1", 1, EntryKind.EFFECT), "another kind")],
)
def test_a_recorded_entry_of_another_call_fails_closed(recorded: JournalEntry, why: str) -> None:
    runs = Runs(_cursor(recorded))
    with pytest.raises(FailRequested) as caught:
        runs.step("a")
    assert caught.value.cause == "nondeterminism", why
    assert caught.value.reason == (
        f"task 't1' replay diverged at call 0: the checkpoint recorded {recorded.call_id!r} but the "
        "workflow asked for 'a#1'"
    )
    assert runs.ran == []


def test_an_unfinished_entry_stays_under_the_cursor_until_it_is_finished() -> None:
    intent = JournalEntry("pay#1", EntryKind.EFFECT, EntryStatus.INTENT, key="t1/pay#1")
    cursor = _cursor(intent)
    call = cursor.take("pay", EntryKind.EFFECT)
    assert (call.call_id, call.entry, call.replayed) == ("pay#1", intent, False)
    assert cursor.position == 0
    cursor.finish(intent, {"id": 7}, "reconciled")
    assert (intent.status, intent.output, intent.evidence, cursor.position) == (
        "done",
        {"id": 7},
        "reconciled",
        1,
    )
    assert cursor.take("pay", EntryKind.EFFECT).call_id == "pay#2"  # past the end: a new call


def test_a_begun_entry_can_be_taken_back_as_if_never_called() -> None:
    cursor = _cursor()
    call = cursor.take("pay", EntryKind.EFFECT)
    assert call.entry is None
    entry = JournalEntry(call.call_id, EntryKind.EFFECT, EntryStatus.INTENT)
    cursor.begin(entry)
    assert cursor.journal == [entry] and cursor.position == 0
    cursor.drop(entry)
    assert cursor.journal == []


def test_each_branch_walks_its_own_journal_with_call_ids_scoped_by_its_key() -> None:
    checkpoint = Checkpoint(IDENTITY)
    lock = threading.RLock()
    left = Cursor.of_branch(checkpoint, "parallel#1/left", lock, "t1")
    right = Cursor.of_branch(checkpoint, "parallel#1/right", lock, "t1")
    assert Runs(left).step("add") == ("new parallel#1/left/add#1", True)
    assert Runs(right).step("add") == ("new parallel#1/right/add#1", True)
    assert checkpoint.journal == []
    assert {key: [e.call_id for e in journal] for key, journal in checkpoint.branch_journals.items()} == {
        "parallel#1/left": ["parallel#1/left/add#1"],
        "parallel#1/right": ["parallel#1/right/add#1"],
    }
    # The next claim replays the branch from its journal, without running it.
    again = Runs(Cursor.of_branch(checkpoint, "parallel#1/left", lock, "t1"))
    assert again.step("add") == ("new parallel#1/left/add#1", False)
    assert again.ran == []


def test_entry_kinds_and_statuses_are_typed_and_stored_as_their_names() -> None:
    entry = JournalEntry("t#1", "timer", "pending", due=1.5)
    assert entry.kind is EntryKind.TIMER and entry.status is EntryStatus.PENDING
    entry.status = "done"  # type: ignore[assignment]  # what older code and tests assign
    assert entry.status is EntryStatus.DONE
    text = Checkpoint(IDENTITY, journal=[entry]).encode("t1", 1 << 20)
    assert (
        '{"call_id":"t#1","due":1.5,"evidence":null,"key":null,"kind":"timer","output":null,"status":"done"}'
        in text
    )
    decoded = Checkpoint.decode("t1", text).journal[0]
    assert decoded.kind is EntryKind.TIMER and decoded.status is EntryStatus.DONE


# --- the engine: the first new call commits through the store ------------------------------


def _workflow(ran: list[str]) -> Workflow:
    workflow = Workflow("replayed", 1)

    @workflow.step()
    def add(ctx: StepContext, n: int) -> int:
        ran.append(ctx.call_id)
        return n + 1

    @workflow.main
    def main(ctx: WorkflowContext, n: int) -> int:
        return add(ctx, add(ctx, n))

    return workflow


def test_the_engine_replays_recorded_steps_and_commits_the_first_new_one(store: WorkflowStore) -> None:
    ran: list[str] = []
    definition = WorkflowDefinition(_workflow(ran))
    store.enqueue(WorkflowTask.new("replayed", 1, 1, checkpoint_id="r1"))
    (claimed,) = store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    checkpoint = Checkpoint(definition.identity, journal=[_done("add#1", 2)])
    run = TaskRun(
        claimed=claimed,
        definition=definition,
        checkpoint=checkpoint,
        store=store,
        flags=LeaseFlags(deadline=time.monotonic() + 30),
        max_steps_per_claim=None,
        max_checkpoint_bytes=1 << 20,
    )
    add = definition.workflow.steps["add"]
    assert run.call(add, (1,), {}) == 2  # recorded: not run
    assert ran == []
    assert run.call(add, (2,), {}) == 3  # new: runs, and is committed before the next body
    assert ran == ["add#2"]
    revision = run.revision
    run.commits.commit_unsaved()
    assert run.revision == revision + 1
    record = store.get_task("r1")
    assert record.revision == run.revision
    stored = Checkpoint.decode("r1", record.checkpoint_json or "")
    assert [(e.call_id, e.output) for e in stored.journal] == [("add#1", 2), ("add#2", 3)]
