"""The checkpoint: semantic progress of one task, replayed step by step.

A checkpoint is a journal of calls in the order the main function made them. Replay walks
the journal with a cursor (``replay.py``); the first call past its end runs for real. Outputs are kept in
their JSON form and structured back by the step's return annotation.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from .codec import CANONICAL_ENCODER as _CANONICAL
from .codec import converter, from_json, to_json
from .errors import CheckpointError, CheckpointTooLarge
from .models import BudgetUsage, DefinitionIdentity

FORMAT_VERSION = 1
DEFAULT_MAX_CHECKPOINT_BYTES = 1 << 20
# How a stored checkpoint that is JSON but not an object is named in the error.
_JSON_KINDS: dict[type, str] = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


class EntryKind(enum.StrEnum):
    """Which call made a journal entry. The values are what checkpoints store (format
    version 1), and part of the call's identity: replay fails closed when the call at a
    position is of another kind than the one recorded there."""

    STEP = "step"
    EFFECT = "effect"
    TIMER = "timer"  # ctx.sleep and ctx.sleep_until
    SIGNAL = "signal"  # ctx.wait_for_signal and each stage of ctx.request_approval
    PARALLEL = "parallel"
    RACE = "race"


class EntryStatus(enum.StrEnum):
    """How far a recorded call got; only a ``DONE`` entry is replayed without running."""

    DONE = "done"
    INTENT = "intent"  # an effect that was called but has no recorded result
    PENDING = "pending"  # a wait not over yet, or branches not all finished


# Structured by a dict lookup instead of calling the enum class (which cattrs does by
# default): decoding a checkpoint builds two of them for every journal entry, at every claim,
# and the enum call was a third of the decoding time of a long journal.
_KINDS = {kind.value: kind for kind in EntryKind}
_STATUSES = {status.value: status for status in EntryStatus}
_DONE = EntryStatus.DONE  # bound once: see replay._DONE
converter.register_structure_hook(EntryKind, lambda value, _: _KINDS[value])
converter.register_structure_hook(EntryStatus, lambda value, _: _STATUSES[value])


@attrs.define
class JournalEntry:
    """One call of the main function (or of a parallel branch), at its position in the
    journal. Strings are accepted for ``kind`` and ``status`` and kept as their enums."""

    call_id: str
    kind: EntryKind
    status: EntryStatus
    output: Any = None
    key: str | None = None  # effect idempotency key
    due: float | None = None  # timer or signal deadline, store time in epoch seconds
    evidence: str | None = None  # how an effect's result became known; on an intent,
    # the not-applied resolution it was already re-run on (so it is not reused)


@attrs.define
class Checkpoint:
    definition: DefinitionIdentity
    format_version: int = FORMAT_VERSION
    phase: str = "running"
    journal: list[JournalEntry] = attrs.Factory(list)
    usage: BudgetUsage = attrs.Factory(BudgetUsage)
    step_failures: dict[str, int] = attrs.Factory(dict)
    # Parallel branches keep their own journals, keyed "parallel#1/<branch>", and the
    # share of usage each consumed against its reservation.
    branch_journals: dict[str, list[JournalEntry]] = attrs.Factory(dict)
    branch_usage: dict[str, BudgetUsage] = attrs.Factory(dict)
    # Set once the task started undoing its steps ("failure" or "cancel"), with why;
    # ``compensated`` lists the call ids already undone, newest first.
    compensating_for: str | None = None
    compensation_reason: str | None = None
    compensated: list[str] = attrs.Factory(list)
    # Call ids of completed steps and effects that have a compensation, in the order they
    # completed across the main function and its branches: undone in reverse. The store
    # reads it too: a queued or waiting task whose ``undo`` is longer than its
    # ``compensated`` is not cancelled at once but left for a worker to compensate.
    undo: list[str] = attrs.Factory(list)
    # The canonical text of each finished journal entry, by id(entry): a finished entry
    # never changes, so each commit encodes only what is new instead of the whole journal.
    _entry_texts: dict[int, tuple[JournalEntry, str]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False
    )

    def encode(self, task_id: str, limit_bytes: int) -> str:
        """The canonical JSON text (equal to ``to_json`` of this checkpoint), refused
        over ``limit_bytes``."""
        text = self._text()
        size = len(text.encode())
        if size > limit_bytes:
            raise CheckpointTooLarge(task_id, size, limit_bytes)
        return text

    def _text(self) -> str:
        # Keys in sorted order. The journals reuse the text of their finished entries;
        # every other field is unstructured into one of two dicts (the keys sorted before
        # "journal" and after it), each encoded in one call, and the pieces are joined.
        # Two encoder calls a commit instead of one per field: the per-call set-up was
        # most of the cost for short journals.
        branches = self.branch_journals
        branch_texts = (f"{json.dumps(key)}:{self._journal_text(branches[key])}" for key in sorted(branches))
        before = _CANONICAL.encode(_unstructure_before_journal(self))
        after = _CANONICAL.encode(_unstructure_after_journal(self))
        return (
            f'{{"branch_journals":{{{",".join(branch_texts)}}},{before[1:-1]},'
            f'"journal":{self._journal_text(self.journal)},{after[1:-1]}}}'
        )

    def _journal_text(self, journal: list[JournalEntry]) -> str:
        texts = []
        for entry in journal:
            cached = self._entry_texts.get(id(entry))
            if cached is not None and cached[0] is entry:
                texts.append(cached[1])
                continue
            text = to_json(entry)
            if entry.status == _DONE:
                self._entry_texts[id(entry)] = (entry, text)
            texts.append(text)
        return "[" + ",".join(texts) + "]"

    @classmethod
    def decode(cls, task_id: str, text: str) -> Checkpoint:
        """Parse a stored checkpoint; anything unreadable fails closed, never resets."""
        try:
            raw = from_json(text)
            if not isinstance(raw, dict):
                kind = _JSON_KINDS.get(type(raw), type(raw).__name__)
                raise CheckpointError(f"checkpoint of task {task_id!r} is corrupt: {kind}, not an object")
            version = raw.get("format_version")
            if version != FORMAT_VERSION:
                raise CheckpointError(
                    f"checkpoint of task {task_id!r} has format version {version!r}; "
                    f"this runifold_sync reads version {FORMAT_VERSION}"
                )
            result: Checkpoint = converter.structure(raw, cls)
            return result
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise CheckpointError(f"checkpoint of task {task_id!r} is corrupt: {exc}") from exc


converter.register_unstructure_hook(
    Checkpoint, make_dict_unstructure_fn(Checkpoint, converter, _entry_texts=override(omit=True))
)


def _unstructure_fields(names: list[str]) -> Any:
    """A generated unstructure function for ``Checkpoint`` that keeps only ``names``."""
    omitted: dict[str, Any] = {
        f.name: override(omit=True) for f in attrs.fields(Checkpoint) if f.name not in names
    }
    return make_dict_unstructure_fn(Checkpoint, converter, **omitted)


# The journals are encoded on their own (see Checkpoint._text): "branch_journals" sorts
# first, and the other fields fall on either side of "journal".
_SORTED_NAMES = sorted(f.name for f in attrs.fields(Checkpoint) if f.name != "_entry_texts")
_JOURNAL_AT = _SORTED_NAMES.index("journal")
assert _SORTED_NAMES[0] == "branch_journals" and 1 < _JOURNAL_AT < len(_SORTED_NAMES) - 1
_unstructure_before_journal = _unstructure_fields(_SORTED_NAMES[1:_JOURNAL_AT])
_unstructure_after_journal = _unstructure_fields(_SORTED_NAMES[_JOURNAL_AT + 1 :])
