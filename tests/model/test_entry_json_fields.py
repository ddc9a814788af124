"""``entry_json`` names JournalEntry's fields itself: it must name all of them."""

from __future__ import annotations

import attrs

from runifold_sync.model.checkpoint import EntryKind, EntryStatus, JournalEntry, entry_json
from runifold_sync.model.codec import converter, from_json, to_json


def test_entry_json_holds_every_field_of_a_journal_entry() -> None:
    entry = JournalEntry("c#1", EntryKind.EFFECT, EntryStatus.INTENT, {"a": [1]}, "t/c#1", 1.5, "ran")
    text = entry_json(entry)
    assert set(from_json(text)) == {field.name for field in attrs.fields(JournalEntry)}
    assert text == to_json(converter.unstructure(entry))


def test_entry_json_puts_the_output_text_in_place() -> None:
    entry = JournalEntry("c#1", EntryKind.STEP, EntryStatus.DONE, [1, {"b": None}])
    assert entry_json(entry, to_json(entry.output)) == entry_json(entry)
