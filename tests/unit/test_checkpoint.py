"""Checkpoint encoding: round trip, size limit, and failing closed on unreadable text."""

from __future__ import annotations

import json

import pytest

from runifold_sync import BudgetUsage, CheckpointError, CheckpointTooLarge, DefinitionIdentity, RunifoldError
from runifold_sync.checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, FORMAT_VERSION, Checkpoint, JournalEntry
from runifold_sync.codec import to_json

IDENTITY = DefinitionIdentity("order-intake", 3, "0123456789abcdef")


def sample() -> Checkpoint:
    return Checkpoint(
        IDENTITY,
        phase="waiting",
        journal=[
            JournalEntry("reserve#1", "step", "done", {"order_id": "o1", "sku": "s"}),
            JournalEntry("charge#1", "effect", "done", {"id": "ch_1"}, key="t1/charge#1", evidence="ran"),
            JournalEntry("notify#1", "effect", "intent", key="t1/notify#1"),
            JournalEntry("timer#1", "timer", "pending", due=1_900_000_000.25),
        ],
        usage=BudgetUsage(steps=2, cost=1.5, elapsed_s=0.25, claims=3),
        step_failures={"notify#1": 2},
    )


def test_checkpoint_round_trips_through_its_encoding() -> None:
    original = sample()
    decoded = Checkpoint.decode("t1", original.encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES))
    assert decoded == original
    assert isinstance(decoded.journal[0], JournalEntry)
    assert isinstance(decoded.usage, BudgetUsage)
    assert decoded.definition == IDENTITY


def test_encoding_reuses_finished_entries_yet_always_equals_the_canonical_form() -> None:
    checkpoint = sample()
    checkpoint.branch_journals["parallel#1/a"] = [JournalEntry("parallel#1/a/add#1", "step", "done", 1)]
    first = checkpoint.encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES)
    assert first == to_json(checkpoint)
    notify = checkpoint.journal[2]  # an intent: not reused until it is finished
    notify.status, notify.output, notify.evidence = "done", {"sent": True}, "ran"
    checkpoint.journal[3].status = "done"
    checkpoint.journal.append(JournalEntry("ship#1", "step", "done", [1, 2]))
    checkpoint.branch_journals["parallel#1/a"].append(JournalEntry("parallel#1/a/add#2", "step", "done", 2))
    checkpoint.usage = checkpoint.usage.add(steps=2)
    checkpoint.phase = "running"
    checkpoint.step_failures["notify#1"] = 3  # containers changed in place
    checkpoint.compensated.append("charge#1")
    second = checkpoint.encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES)
    assert second == to_json(checkpoint) != first
    assert Checkpoint.decode("t1", second) == checkpoint
    assert "_entry_texts" not in json.loads(second)
    checkpoint.step_failures.clear()
    assert checkpoint.encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES) == to_json(checkpoint)


def test_encoding_records_the_format_version() -> None:
    text = sample().encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES)
    assert json.loads(text)["format_version"] == FORMAT_VERSION


def test_checkpoint_over_the_size_limit_raises_too_large_naming_size_and_limit() -> None:
    checkpoint = Checkpoint(IDENTITY, journal=[JournalEntry("big#1", "step", "done", "x" * 5000)])
    size = len(checkpoint.encode("t1", 10**9).encode())
    with pytest.raises(CheckpointTooLarge) as info:
        checkpoint.encode("t1", 4096)
    error = info.value
    assert isinstance(error, RunifoldError)
    assert isinstance(error, CheckpointError)
    assert (error.size_bytes, error.limit_bytes, error.task_id) == (size, 4096, "t1")
    assert f"{size} bytes" in str(error)
    assert "limit of 4096 bytes" in str(error)


def test_checkpoint_exactly_at_the_limit_is_accepted() -> None:
    checkpoint = sample()
    size = len(checkpoint.encode("t1", 10**9).encode())
    assert Checkpoint.decode("t1", checkpoint.encode("t1", size)) == checkpoint


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", "null"])
def test_unreadable_checkpoint_raises_checkpoint_error_naming_the_task(text: str) -> None:
    with pytest.raises(CheckpointError, match="'t1'"):
        Checkpoint.decode("t1", text)


def test_checkpoint_with_wrong_structure_raises_checkpoint_error() -> None:
    raw = json.loads(sample().encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES))
    raw["journal"] = [{"call_id": "x#1"}]  # kind and status missing
    with pytest.raises(CheckpointError, match="corrupt"):
        Checkpoint.decode("t1", json.dumps(raw))


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, "1", None])
def test_wrong_format_version_raises_checkpoint_error_naming_it(version: object) -> None:
    raw = json.loads(sample().encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES))
    raw["format_version"] = version
    with pytest.raises(CheckpointError) as info:
        Checkpoint.decode("t1", json.dumps(raw))
    assert f"format version {version!r}" in str(info.value)


def test_missing_format_version_raises_checkpoint_error() -> None:
    raw = json.loads(sample().encode("t1", DEFAULT_MAX_CHECKPOINT_BYTES))
    del raw["format_version"]
    with pytest.raises(CheckpointError, match="format version None"):
        Checkpoint.decode("t1", json.dumps(raw))
