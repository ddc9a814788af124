"""Reading a task's checkpoint back from the store, outside a claim: for ``show``, the
dashboard, tools and tests that look inside a task."""

from __future__ import annotations

from typing import Any

from ..errors import CheckpointError
from ..model.checkpoint import MAIN, Checkpoint
from ..model.codec import from_json
from .base import WorkflowStore


def read_checkpoint(store: WorkflowStore, task_id: str) -> Checkpoint | None:
    """The stored checkpoint of ``task_id`` as a claim loads it, None before its first
    commit: for tools and tests that look inside a task. The head and the journal are two
    reads, so a task being written meanwhile may show a journal one commit ahead."""
    record = store.get_task(task_id)
    if record.checkpoint_json is None:
        return None
    return Checkpoint.decode(task_id, record.checkpoint_json, store.read_journal(task_id))


def newest_entries(store: WorkflowStore, task_id: str, head_json: str, limit: int) -> tuple[int, list[Any]]:
    """How many entries the main journal of ``task_id`` (whose stored head is
    ``head_json``) holds, and its newest ``limit`` as stored (JSON values, oldest first):
    the head's tail, and only as many rows as it lacks."""
    try:
        tail = from_json(head_json).get("journal_tail", {}).get(MAIN)
        if tail is None:
            count, rows = store.journal_tail(task_id, limit)
            return count, [from_json(row.entry_json or "null") for row in rows]
        start, entries = int(tail["start"]), list(tail["entries"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint of task {task_id!r} is corrupt: {exc}") from exc
    shown = entries[-limit:]
    older = limit - len(shown)
    if older > 0 and start > 0:
        shown = [from_json(row.entry_json or "null") for row in store.journal_tail(task_id, older)[1]] + shown
    return start + len(entries), shown
