"""A run exported whole as JSON (``show TASK --export``): its input, its checkpoint (the
head and every journal row, as stored) and its history, so a production run can be
replayed against new code in a test (``runifold_sync.testing.replay``) or kept as a
regression case. The journal rows are exported as the store holds them, so the replay
decodes the very checkpoint a claim would."""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model import validate
from ..model.checkpoint import Checkpoint, JournalRow
from ..model.codec import from_json, to_json
from ..store.base import WorkflowStore

FORMAT = "runifold-run"
FORMAT_VERSION = 1


def export_run(store: WorkflowStore, task_id: str) -> dict[str, Any]:
    """Task ``task_id`` as an export: JSON-ready, read from the store in three reads."""
    record = store.get_task(task_id)
    rows = store.read_journal(task_id) if record.checkpoint_json is not None else []
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "task_id": record.task_id,
        "definition": record.definition_name,
        "version": record.definition_version,
        "tenant": record.tenant,
        "queue": record.queue,
        "state": record.state.value,
        "outcome": None if record.outcome is None else record.outcome.value,
        "input": from_json(record.input_json),
        "checkpoint": None if record.checkpoint_json is None else from_json(record.checkpoint_json),
        "journal_rows": [
            {
                "journal": r.journal,
                "position": r.position,
                "entry": None if r.entry_json is None else from_json(r.entry_json),
            }
            for r in rows
        ],
        "history": [
            {
                "at": e.at.isoformat(),
                "kind": e.kind,
                "worker": e.worker_id,
                "token": e.fencing_token,
                "detail": e.detail,
            }
            for e in store.history(task_id)
        ],
    }


@attrs.frozen
class ExportedRun:
    """An export read back: what a dry replay needs."""

    task_id: str
    definition: str
    version: int
    input_json: str
    checkpoint: Checkpoint | None


def read_export(data: Any) -> ExportedRun:
    """An export (the decoded JSON of ``show --export``) checked and read back;
    :class:`InvalidArgument` naming the field that is missing or wrong."""
    if not isinstance(data, dict):
        validate.refuse("a run export", "a JSON object", data)
    if data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        raise InvalidArgument(
            f"not a run export of format {FORMAT!r} version {FORMAT_VERSION}: format "
            f"{data.get('format')!r} version {data.get('format_version')!r}"
        )
    for field, kind in (("task_id", str), ("definition", str), ("version", int), ("journal_rows", list)):
        if not isinstance(data.get(field), kind) or isinstance(data.get(field), bool):
            validate.refuse(f"run export field {field!r}", f"a {kind.__name__}", data.get(field))
    if "input" not in data:
        raise InvalidArgument("run export field 'input' is missing")
    task_id = data["task_id"]
    head = data.get("checkpoint")
    checkpoint = None
    if head is not None:
        try:
            rows = [
                JournalRow(r["journal"], r["position"], None if r["entry"] is None else to_json(r["entry"]))
                for r in data["journal_rows"]
            ]
        except (KeyError, TypeError) as exc:
            raise InvalidArgument(f"run export field 'journal_rows' has a malformed row: {exc!r}") from exc
        checkpoint = Checkpoint.decode(
            task_id, to_json(head), sorted(rows, key=lambda r: (r.journal, r.position))
        )
    return ExportedRun(task_id, data["definition"], data["version"], to_json(data["input"]), checkpoint)
