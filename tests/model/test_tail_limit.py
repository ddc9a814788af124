"""The journal tail's entries are each held to the entry limit at every write, their kept
texts included, and only each on its own: a tail over the limit in all is no error."""

from __future__ import annotations

import pytest

from runifold_sync.errors import CheckpointTooLarge
from runifold_sync.model.checkpoint import MAIN, Checkpoint, JournalEntry
from runifold_sync.model.codec import to_json
from runifold_sync.store import DefinitionIdentity

IDENTITY = DefinitionIdentity("flow", 1, "f" * 16)


def _done(checkpoint: Checkpoint, call_id: str, output: str) -> None:
    checkpoint.append(MAIN, JournalEntry(call_id, "step", "done", output), to_json(output))


def test_a_kept_entry_text_over_the_limit_is_refused_behind_smaller_ones() -> None:
    checkpoint = Checkpoint(IDENTITY)
    _done(checkpoint, "small#1", "x")
    checkpoint.stored(checkpoint.write("t1", 1024))  # the head alone: small#1 stays in the tail
    _done(checkpoint, "small#2", "y" * 300)
    _done(checkpoint, "big#1", "z" * 2000)
    with pytest.raises(CheckpointTooLarge) as info:
        checkpoint.write("t1", 1024)
    assert info.value.part == "journal entry 'big#1'"


def test_tail_entries_each_under_the_limit_are_written_though_over_it_together() -> None:
    checkpoint = Checkpoint(IDENTITY)
    for n in range(12):  # over TAIL_BYTES together: the write moves them into rows
        _done(checkpoint, f"step#{n}", "x" * 400)
    write = checkpoint.write("t1", 1024)
    assert [row.position for row in write.journal] == list(range(12))
