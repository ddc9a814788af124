"""Checkpoint storage: a head and journal rows, each commit writing only what changed;
the size limit per entry; failing closed on anything unreadable."""

from __future__ import annotations

import json

import pytest

from runifold_sync import BudgetUsage
from runifold_sync.errors import CheckpointError, CheckpointTooLarge, RunifoldError
from runifold_sync.model.checkpoint import (
    DEFAULT_MAX_ENTRY_BYTES,
    FORMAT_VERSION,
    MAIN,
    TAIL_BYTES,
    TAIL_ENTRIES,
    Checkpoint,
    CheckpointWrite,
    JournalEntry,
    JournalRow,
)
from runifold_sync.model.codec import to_json
from runifold_sync.store import DefinitionIdentity

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


def _step(n: int, output: object = None) -> JournalEntry:
    return JournalEntry(f"s#{n}", "step", "done", n if output is None else output)


def test_a_short_journal_lives_in_the_heads_tail_and_decodes_back_equal() -> None:
    original = sample()  # entries given to the constructor are not stored yet
    write = original.write("t1", LIMIT)
    assert write.journal == ()  # four small entries: all in the head
    tail = json.loads(write.head_json)["journal_tail"]
    assert {key: (t["start"], len(t["entries"])) for key, t in tail.items()} == {
        MAIN: (0, 3),
        "parallel#1/a": (0, 1),
    }
    rows: dict[tuple[str, int], str] = {}
    stored(original, write, rows)
    decoded = reload(write.head_json, rows)
    assert decoded == original
    assert isinstance(decoded.journal[0], JournalEntry) and isinstance(decoded.usage, BudgetUsage)
    assert decoded.write("t1", LIMIT) == write  # a decoded checkpoint is what is stored


def test_the_head_holds_the_format_version_and_no_journal_beyond_its_tail() -> None:
    head = json.loads(sample().write("t1", LIMIT).head_json)
    assert head["format_version"] == FORMAT_VERSION == 2
    assert head["run"] == 1
    assert "journal" not in head and "branch_journals" not in head
    assert not any(key.startswith("_") for key in head)
    text = sample().write("t1", LIMIT).head_json
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))  # canonical


def test_a_tail_past_its_entry_bound_moves_into_rows_in_one_write_and_the_next_entries_start_a_new_tail() -> (
    None
):
    checkpoint = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    for n in range(TAIL_ENTRIES):
        checkpoint.append(MAIN, _step(n))
        write = checkpoint.write("t1", LIMIT)
        assert write.journal == ()  # still within the tail
        stored(checkpoint, write, rows)
    checkpoint.append(MAIN, _step(TAIL_ENTRIES))
    write = checkpoint.write("t1", LIMIT)
    assert [(r.journal, r.position) for r in write.journal] == [(MAIN, n) for n in range(TAIL_ENTRIES + 1)]
    assert json.loads(write.head_json)["journal_tail"] == {}
    stored(checkpoint, write, rows)
    checkpoint.append(MAIN, _step(TAIL_ENTRIES + 1))
    write = checkpoint.write("t1", LIMIT)
    assert write.journal == ()
    assert json.loads(write.head_json)["journal_tail"][MAIN]["start"] == TAIL_ENTRIES + 1
    stored(checkpoint, write, rows)
    assert reload(write.head_json, rows) == checkpoint


def test_a_tail_past_its_byte_bound_moves_into_rows_at_once() -> None:
    checkpoint = Checkpoint(IDENTITY)
    checkpoint.append(MAIN, _step(0))
    checkpoint.append(MAIN, _step(1, "x" * TAIL_BYTES))
    write = checkpoint.write("t1", LIMIT)
    assert [r.position for r in write.journal] == [0, 1]
    assert len(write.head_json) < TAIL_BYTES


def test_an_unfinished_entry_in_a_row_is_written_again_when_it_moves_on_and_finished_ones_never() -> None:
    checkpoint = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    for n in range(TAIL_ENTRIES):
        checkpoint.append(MAIN, _step(n))
    intent = JournalEntry("charge#1", "effect", "intent", key="t1/charge#1")
    checkpoint.append(MAIN, intent)  # 17 entries: all into rows, the intent among them
    stored(checkpoint, checkpoint.write("t1", LIMIT), rows)
    assert checkpoint.write("t1", LIMIT).journal == ()
    intent.status, intent.output, intent.evidence = "done", {"id": "ch_1"}, "ran"
    write = checkpoint.write("t1", LIMIT)
    assert [(r.journal, r.position) for r in write.journal] == [(MAIN, TAIL_ENTRIES)]
    stored(checkpoint, write, rows)
    assert checkpoint.write("t1", LIMIT).journal == ()
    assert reload(write.head_json, rows) == checkpoint


def test_an_unfinished_entry_taken_back_out_leaves_the_tail_or_deletes_its_row() -> None:
    in_tail = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    intent = JournalEntry("charge#1", "effect", "intent", key="t1/charge#1")
    in_tail.append(MAIN, _step(0))
    in_tail.append(MAIN, intent)
    stored(in_tail, in_tail.write("t1", LIMIT), rows)
    in_tail.remove(MAIN, intent)
    write = in_tail.write("t1", LIMIT)
    assert write.journal == () and reload(write.head_json, rows).journal == [_step(0)]

    in_rows = Checkpoint(IDENTITY)
    rows = {}
    for n in range(TAIL_ENTRIES):
        in_rows.append(MAIN, _step(n))
    in_rows.append(MAIN, intent)
    stored(in_rows, in_rows.write("t1", LIMIT), rows)
    in_rows.remove(MAIN, intent)
    write = in_rows.write("t1", LIMIT)
    assert write.journal == (JournalRow(MAIN, TAIL_ENTRIES, None),)
    stored(in_rows, write, rows)
    assert len(rows) == TAIL_ENTRIES
    assert reload(write.head_json, rows).journal == [_step(n) for n in range(TAIL_ENTRIES)]


def test_branch_journals_share_the_tail_bound_with_the_main_one() -> None:
    checkpoint = Checkpoint(IDENTITY)
    rows: dict[tuple[str, int], str] = {}
    for n in range(TAIL_ENTRIES // 2):
        checkpoint.append(f"parallel#{n}/a", _step(n))
        checkpoint.append(f"parallel#{n}/b", _step(n))
    stored(checkpoint, checkpoint.write("t1", LIMIT), rows)
    assert rows == {}
    checkpoint.append(MAIN, _step(99))
    write = checkpoint.write("t1", LIMIT)
    assert len(write.journal) == TAIL_ENTRIES + 1  # every tail went
    stored(checkpoint, write, rows)
    assert reload(write.head_json, rows) == checkpoint


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
    assert checkpoint.write("t1", size).journal[0].position == 0  # exactly at the limit: accepted (a row)


@pytest.mark.parametrize(
    "output",
    [7, None, "s", {"a": [1, "caf\u00e9", {"b": None}]}, ['"output":null', "\\"]],
    ids=["int", "null", "string", "object", "quotes and backslashes"],
)
def test_an_entry_appended_with_its_outputs_text_is_written_as_the_entry_encoded_whole(
    output: object,
) -> None:
    tricky = 'a",\\ "output":null'  # quotes, backslashes and the key's own text in other fields
    entry = JournalEntry(f"step#1{tricky}", "step", "done", output, key=tricky, evidence=tricky)
    whole = Checkpoint(IDENTITY)
    whole.append(MAIN, entry)
    given = Checkpoint(IDENTITY)
    given.append(
        MAIN,
        JournalEntry(entry.call_id, "step", "done", output, key=tricky, evidence=tricky),
        to_json(output),
    )
    assert given.write("t1", LIMIT) == whole.write("t1", LIMIT)


def test_an_entry_appended_with_its_outputs_text_is_still_refused_over_the_limit() -> None:
    checkpoint = Checkpoint(IDENTITY)
    output = "x" * 5000
    checkpoint.append(MAIN, JournalEntry("big#1", "step", "done", output), to_json(output))
    with pytest.raises(CheckpointTooLarge):
        checkpoint.write("t1", 4096)


def test_the_limit_is_per_entry_so_many_entries_together_may_exceed_it() -> None:
    checkpoint = Checkpoint(IDENTITY)
    for n in range(100):
        checkpoint.append(MAIN, _step(n, "x" * 100))
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


def test_a_journal_with_a_gap_an_unreadable_entry_or_a_misplaced_tail_fails_closed() -> None:
    head = Checkpoint(IDENTITY).write("t1", LIMIT).head_json
    entry = to_json(sample().journal[0])
    with pytest.raises(CheckpointError, match="its main journal has no entry at position 1"):
        Checkpoint.decode("t1", head, [JournalRow(MAIN, 0, entry), JournalRow(MAIN, 2, entry)])
    with pytest.raises(CheckpointError, match="journal 'parallel#1/a' has no entry at position 0"):
        Checkpoint.decode("t1", head, [JournalRow("parallel#1/a", 1, entry)])
    with pytest.raises(CheckpointError, match="corrupt"):
        Checkpoint.decode("t1", head, [JournalRow(MAIN, 0, '{"call_id": "x#1"}')])  # kind and status missing
    tailed = sample().write("t1", LIMIT).head_json  # its tails start at 0
    with pytest.raises(
        CheckpointError, match="its main journal has 1 stored entries but its tail starts at 0"
    ):
        Checkpoint.decode("t1", tailed, [JournalRow(MAIN, 0, entry)])


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
