"""Checkpoint storage: a head and journal rows, each commit writing only what changed;
the size limit per entry; failing closed on anything unreadable."""

from __future__ import annotations

import json

import pytest

from runifold_sync import BudgetUsage, CheckpointError, CheckpointTooLarge, DefinitionIdentity, RunifoldError
from runifold_sync.checkpoint import (
    DEFAULT_MAX_ENTRY_BYTES,
    FORMAT_VERSION,
    MAIN,
    Checkpoint,
    CheckpointWrite,
    JournalEntry,
)
from runifold_sync.codec import to_json
from runifold_sync.store.records import JournalRow

IDENTITY = DefinitionIdentity("order-intake", 3, "0123456789abcdef")
LIMIT = DEFAULT_MAX_ENTRY_BYTES


def sample() -> Checkpoint:
    return Checkpoint(
        IDENTITY,
        phase="waiting",
        journal=[
            JournalEntry("reserve#1", "step", "done", {"order_id": "o1", "sku": "s"}),
            JournalEntry("charge#1", "effect", "done", {"id": "ch_1"}, key="t1/charge#1", evidence="ran"),
            JournalEntry("notify#1", "effect", "intent", key="t1/notify#1"),
        ],
        branch_journals={"parallel#1/a": [JournalEntry("parallel#1/a/add#1", "step", "done", 1)]},
        usage=BudgetUsage(steps=2, cost=1.5, elapsed_s=0.25, claims=3),
        step_failures={"notify#1": 2},
    )


def stored(checkpoint: Checkpoint, write: CheckpointWrite, rows: dict[tuple[str, int], str]) -> None:
    """Apply ``write`` as the store does (rows by journal and position) and record it."""
    for row in write.journal:
        if row.entry_json is None:
            del rows[(row.journal, row.position)]
        else:
            rows[(row.journal, row.position)] = row.entry_json
    checkpoint.stored(write)


def reload(head: str, rows: dict[tuple[str, int], str]) -> Checkpoint:
    ordered = [JournalRow(key, position, text) for (key, position), text in sorted(rows.items())]
    return Checkpoint.decode("t1", head, ordered)


def test_a_new_checkpoint_writes_its_head_and_every_entry_and_decodes_back_equal() -> None:
    original = sample()  # entries given to the constructor are not stored yet
    write = original.write("t1", LIMIT)
    assert [(r.journal, r.position) for r in write.journal] == [
        (MAIN, 0),
        (MAIN, 1),
        (MAIN, 2),
        ("parallel#1/a", 0),
    ]
    rows: dict[tuple[str, int], str] = {}
    stored(original, write, rows)
    decoded = reload(write.head_json, rows)
    assert decoded == original
    assert isinstance(decoded.journal[0], JournalEntry) and isinstance(decoded.usage, BudgetUsage)
    assert decoded.write("t1", LIMIT).journal == ()  # a decoded checkpoint is what is stored


def test_the_head_holds_the_format_version_and_no_journal() -> None:
    head = json.loads(sample().write("t1", LIMIT).head_json)
    assert head["format_version"] == FORMAT_VERSION == 2
    assert head["run"] == 1
    assert "journal" not in head and "branch_journals" not in head
    assert not any(key.startswith("_") for key in head)
    assert to_json(sample()) == sample().write("t1", LIMIT).head_json


def test_after_a_write_only_new_and_moved_on_entries_are_written_again() -> None:
    checkpoint = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    for entry in sample().journal:
        checkpoint.append(MAIN, entry)
    stored(checkpoint, checkpoint.write("t1", LIMIT), rows)
    assert checkpoint.write("t1", LIMIT).journal == ()  # nothing changed: the head alone

    notify = checkpoint.journal[2]  # the intent finishes; a step is appended
    notify.status, notify.output, notify.evidence = "done", {"sent": True}, "ran"
    checkpoint.append(MAIN, JournalEntry("ship#1", "step", "done", [1, 2]))
    checkpoint.append("parallel#2/b", JournalEntry("parallel#2/b/add#1", "step", "done", 2))
    write = checkpoint.write("t1", LIMIT)
    assert [(r.journal, r.position) for r in write.journal] == [(MAIN, 2), (MAIN, 3), ("parallel#2/b", 0)]
    stored(checkpoint, write, rows)
    assert checkpoint.write("t1", LIMIT).journal == ()
    assert reload(write.head_json, rows) == checkpoint


def test_an_unfinished_entry_taken_back_out_deletes_its_row() -> None:
    checkpoint = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    intent = JournalEntry("charge#1", "effect", "intent", key="t1/charge#1")
    checkpoint.append(MAIN, JournalEntry("reserve#1", "step", "done", 1))
    checkpoint.append(MAIN, intent)
    stored(checkpoint, checkpoint.write("t1", LIMIT), rows)
    checkpoint.remove(MAIN, intent)
    write = checkpoint.write("t1", LIMIT)
    assert write.journal == (JournalRow(MAIN, 1, None),)
    stored(checkpoint, write, rows)
    assert list(rows) == [(MAIN, 0)]
    assert reload(write.head_json, rows).journal == [JournalEntry("reserve#1", "step", "done", 1)]


def test_a_decoded_checkpoint_knows_what_is_stored_and_writes_only_what_follows() -> None:
    checkpoint = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    for entry in sample().journal:
        checkpoint.append(MAIN, entry)
    write = checkpoint.write("t1", LIMIT)
    stored(checkpoint, write, rows)
    claimed = reload(write.head_json, rows)  # the next claim
    assert claimed.write("t1", LIMIT).journal == ()
    claimed.journal[2].status = "done"  # the intent it found resolved
    claimed.append(MAIN, JournalEntry("ship#1", "step", "done", 3))
    assert [(r.journal, r.position) for r in claimed.write("t1", LIMIT).journal] == [(MAIN, 2), (MAIN, 3)]


def test_the_next_run_starts_empty_with_usage_carried_over() -> None:
    checkpoint = sample()
    checkpoint.undo.append("charge#1")
    following = checkpoint.next_run()
    assert (following.run, following.journal, following.branch_journals) == (2, [], {})
    assert (following.usage, following.undo, following.step_failures) == (checkpoint.usage, [], {})
    assert following.definition == IDENTITY
    assert json.loads(following.write("t1", LIMIT).head_json)["run"] == 2


def test_an_entry_over_the_limit_raises_too_large_naming_it_and_the_sizes() -> None:
    checkpoint = Checkpoint(IDENTITY)
    checkpoint.append(MAIN, JournalEntry("big#1", "step", "done", "x" * 5000))
    size = len(to_json(checkpoint.journal[0]).encode())
    with pytest.raises(CheckpointTooLarge) as info:
        checkpoint.write("t1", 4096)
    error = info.value
    assert isinstance(error, RunifoldError) and isinstance(error, CheckpointError)
    assert (error.size_bytes, error.limit_bytes, error.task_id, error.part) == (
        size,
        4096,
        "t1",
        "journal entry 'big#1'",
    )
    assert str(error) == (
        f"journal entry 'big#1' of task 't1' is {size} bytes, over the limit of 4096 bytes "
        "(max_entry_bytes); keep large artifacts outside and store their ids"
    )
    assert checkpoint.write("t1", size).journal[0].position == 0  # exactly at the limit: accepted


def test_the_limit_is_per_entry_so_many_entries_together_may_exceed_it() -> None:
    checkpoint = Checkpoint(IDENTITY)
    for n in range(100):
        checkpoint.append(MAIN, JournalEntry(f"s#{n}", "step", "done", "x" * 100))
    write = checkpoint.write("t1", 1024)
    assert len(write.journal) == 100
    assert sum(len((r.entry_json or "").encode()) for r in write.journal) > 10 * 1024


def test_a_head_over_the_limit_raises_too_large() -> None:
    checkpoint = Checkpoint(IDENTITY, undo=[f"step-with-a-long-name#{n}" for n in range(200)])
    with pytest.raises(CheckpointTooLarge) as info:
        checkpoint.write("t1", 1024)
    assert info.value.part == "checkpoint head"


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", "null"])
def test_an_unreadable_head_raises_checkpoint_error_naming_the_task(text: str) -> None:
    with pytest.raises(CheckpointError, match="'t1'"):
        Checkpoint.decode("t1", text)


def test_a_journal_with_a_gap_or_an_unreadable_entry_fails_closed() -> None:
    head = sample().write("t1", LIMIT).head_json
    entry = to_json(sample().journal[0])
    with pytest.raises(CheckpointError, match="its main journal has no entry at position 1"):
        Checkpoint.decode("t1", head, [JournalRow(MAIN, 0, entry), JournalRow(MAIN, 2, entry)])
    with pytest.raises(CheckpointError, match="journal 'parallel#1/a' has no entry at position 0"):
        Checkpoint.decode("t1", head, [JournalRow("parallel#1/a", 1, entry)])
    with pytest.raises(CheckpointError, match="corrupt"):
        Checkpoint.decode("t1", head, [JournalRow(MAIN, 0, '{"call_id": "x#1"}')])  # kind and status missing


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 1, 0, "2", None])
def test_a_wrong_format_version_raises_checkpoint_error_naming_it(version: object) -> None:
    raw = json.loads(sample().write("t1", LIMIT).head_json)
    raw["format_version"] = version
    with pytest.raises(CheckpointError) as info:
        Checkpoint.decode("t1", json.dumps(raw))
    assert f"format version {version!r}" in str(info.value)


def test_a_missing_format_version_raises_checkpoint_error() -> None:
    raw = json.loads(sample().write("t1", LIMIT).head_json)
    del raw["format_version"]
    with pytest.raises(CheckpointError, match="format version None"):
        Checkpoint.decode("t1", json.dumps(raw))
