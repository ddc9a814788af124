"""A task's journal as the tests look at it: entries as plain dicts (what the store keeps
for each), read the way a claim reads them (rows and the head's tail together)."""

from __future__ import annotations

from typing import Any

from runifold_sync import WorkflowStore
from runifold_sync.model.checkpoint import MAIN
from runifold_sync.model.codec import from_json, to_json
from runifold_sync.store.checkpoints import read_checkpoint


def entries(store: WorkflowStore, task_id: str, journal: str = MAIN) -> list[dict[str, Any]]:
    """The entries of journal ``journal`` (the main one by default) of ``task_id``; none
    before its first commit."""
    checkpoint = read_checkpoint(store, task_id)
    if checkpoint is None:
        return []
    found: list[dict[str, Any]] = [from_json(to_json(e)) for e in checkpoint.journal_of(journal)]
    return found
