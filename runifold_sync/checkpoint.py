"""The checkpoint: semantic progress of one task, replayed step by step.

A checkpoint is a journal of calls in the order the main function made them (and one
journal per parallel branch), plus a small head: the definition it belongs to, the run,
the phase, usage and the undo bookkeeping. Replay walks a journal with a cursor
(``replay.py``); the first call past its end runs for real. Outputs are kept in their
JSON form and structured back by the step's return annotation.

The store keeps each journal entry in its own row and the head in the task row, so a
commit writes only what changed since the last one (:meth:`Checkpoint.write`): the new
entry, an unfinished entry that moved on, and the head. The cost of a step does not grow
with the steps before it, and the size limit is per entry, not per workflow.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from .codec import CANONICAL_ENCODER as _CANONICAL
from .codec import converter, from_json, to_json
from .errors import CheckpointError, CheckpointTooLarge
from .models import BudgetUsage, DefinitionIdentity
from .store.records import JournalRow

if TYPE_CHECKING:
    from .store.base import WorkflowStore

# Version 2: the journals live in their own rows, the head holds the rest. Version 1 kept
# everything in one text; migration 0007 converts those in place.
FORMAT_VERSION = 2
DEFAULT_MAX_ENTRY_BYTES = 1 << 20
MAIN = ""  # the key of the main function's journal (branches are keyed "parallel#1/a")
# How a stored head that is JSON but not an object is named in the error.
_JSON_KINDS: dict[type, str] = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


class EntryKind(enum.StrEnum):
    """Which call made a journal entry. The values are what journals store, and part of
    the call's identity: replay fails closed when the call at a position is of another
    kind than the one recorded there."""

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
# default): decoding builds two of them for every journal entry, at every claim, and the
# enum call was a third of the decoding time of a long journal.
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


@attrs.frozen
class CheckpointWrite:
    """What one commit stores: the head's text and the journal rows that changed."""

    head_json: str
    journal: tuple[JournalRow, ...] = ()


@attrs.define
class Checkpoint:
    definition: DefinitionIdentity
    format_version: int = FORMAT_VERSION
    run: int = 1  # counts ctx.continue_as_new: each run starts with an empty journal
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
    # What the store holds (see ``write``): each journal's stored length, the text of
    # each stored entry that was unfinished (it may still change), and the journals that
    # grew or shrank since.
    _stored_lengths: dict[str, int] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    _stored_open: dict[tuple[str, int], str] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    _resized: set[str] = attrs.field(factory=set, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # Entries given to the constructor are not stored yet (``_loaded`` says when they are).
        self._resized.update(key for key, journal in self._journals() if journal)

    # --- journals, changed through these so a commit knows what changed -------------

    def journal_of(self, key: str) -> list[JournalEntry]:
        """The journal ``key`` (``MAIN`` or a branch key), made empty on first use."""
        if key == MAIN:
            return self.journal
        return self.branch_journals.setdefault(key, [])

    def append(self, key: str, entry: JournalEntry) -> None:
        self.journal_of(key).append(entry)
        self._resized.add(key)

    def remove(self, key: str, entry: JournalEntry) -> None:
        """Take an entry back out (only ever the unfinished last one of its journal)."""
        self.journal_of(key).remove(entry)
        self._resized.add(key)

    # --- storing -------------------------------------------------------------------

    def write(self, task_id: str, limit_bytes: int) -> CheckpointWrite:
        """The head's text and the journal rows that differ from what the store holds,
        each refused over ``limit_bytes``. Nothing changes here: :meth:`stored` records
        the write once the store took it."""
        rows = []
        for (key, position), stored in self._stored_open.items():
            journal = self.journal_of(key)
            if position < len(journal):
                text = _entry_text(task_id, journal[position], limit_bytes)
                if text != stored:
                    rows.append(JournalRow(key, position, text))
        for key in sorted(self._resized):
            journal = self.journal_of(key)
            stored_length = self._stored_lengths.get(key, 0)
            rows.extend(
                JournalRow(key, position, _entry_text(task_id, journal[position], limit_bytes))
                for position in range(stored_length, len(journal))
            )
            rows.extend(JournalRow(key, position, None) for position in range(len(journal), stored_length))
        head = _CANONICAL.encode(_unstructure_head(self))
        size = len(head.encode())
        if size > limit_bytes:
            raise CheckpointTooLarge(task_id, "checkpoint head", size, limit_bytes)
        return CheckpointWrite(head, tuple(rows))

    def stored(self, write: CheckpointWrite) -> None:
        """Record that the store now holds ``write``."""
        for row in write.journal:
            place = (row.journal, row.position)
            entry = None if row.entry_json is None else self.journal_of(row.journal)[row.position]
            if entry is None or entry.status == _DONE:
                self._stored_open.pop(place, None)
            else:
                self._stored_open[place] = row.entry_json  # type: ignore[assignment]
        for key in self._resized:
            self._stored_lengths[key] = len(self.journal_of(key))
        self._resized.clear()

    def idempotency_key(self, task_id: str, call_id: str) -> str:
        """The key of an effect (or compensation) call: ``<task id>/<call id>``, with the
        run number from run 2 on, since every run's call ids start again and the same
        effect a month later (a new run) is a new effect to the outside world."""
        if self.run == 1:
            return f"{task_id}/{call_id}"
        return f"{task_id}/run{self.run}/{call_id}"

    def next_run(self) -> Checkpoint:
        """The checkpoint a ``continue_as_new`` starts: the next run, an empty journal,
        usage carried over (it never decreases), nothing to undo."""
        return Checkpoint(self.definition, run=self.run + 1, usage=self.usage)

    @classmethod
    def decode(cls, task_id: str, head_json: str, rows: Iterable[JournalRow] = ()) -> Checkpoint:
        """A stored head and its journal rows (ordered by journal and position) as a
        checkpoint; anything unreadable fails closed, never resets."""
        try:
            raw = from_json(head_json)
            if not isinstance(raw, dict):
                kind = _JSON_KINDS.get(type(raw), type(raw).__name__)
                raise CheckpointError(f"checkpoint of task {task_id!r} is corrupt: {kind}, not an object")
            version = raw.get("format_version")
            if version != FORMAT_VERSION:
                raise CheckpointError(
                    f"checkpoint of task {task_id!r} has format version {version!r}; "
                    f"this runifold_sync reads version {FORMAT_VERSION}"
                )
            texts = _journal_texts(task_id, rows)
            # One parse per journal: joined, the texts parse many times faster than one by one.
            raw["journal"] = from_json(f"[{','.join(texts.pop(MAIN, []))}]")
            raw["branch_journals"] = {key: from_json(f"[{','.join(found)}]") for key, found in texts.items()}
            checkpoint: Checkpoint = converter.structure(raw, cls)
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
            raise CheckpointError(f"checkpoint of task {task_id!r} is corrupt: {exc}") from exc
        checkpoint._loaded()
        return checkpoint

    def _loaded(self) -> None:
        """Everything decoded is what the store holds."""
        self._resized.clear()
        for key, journal in self._journals():
            self._stored_lengths[key] = len(journal)
            for position, entry in enumerate(journal):
                if entry.status != _DONE:
                    self._stored_open[(key, position)] = to_json(entry)

    def _journals(self) -> Iterator[tuple[str, list[JournalEntry]]]:
        yield MAIN, self.journal
        yield from self.branch_journals.items()


def read_checkpoint(store: WorkflowStore, task_id: str) -> Checkpoint | None:
    """The stored checkpoint of ``task_id`` as a claim loads it, None before its first
    commit: for tools and tests that look inside a task. The head and the journal are two
    reads, so a task being written meanwhile may show a journal one commit ahead."""
    record = store.get_task(task_id)
    if record.checkpoint_json is None:
        return None
    return Checkpoint.decode(task_id, record.checkpoint_json, store.read_journal(task_id))


def _entry_text(task_id: str, entry: JournalEntry, limit_bytes: int) -> str:
    text = to_json(entry)
    size = len(text.encode())
    if size > limit_bytes:
        raise CheckpointTooLarge(task_id, f"journal entry {entry.call_id!r}", size, limit_bytes)
    return text


def _journal_texts(task_id: str, rows: Iterable[JournalRow]) -> dict[str, list[str]]:
    """Each journal's entry texts in order; a gap or a repeat fails closed."""
    texts: dict[str, list[str]] = {}
    for row in rows:
        found = texts.setdefault(row.journal, [])
        if row.position != len(found) or row.entry_json is None:
            name = "main journal" if row.journal == MAIN else f"journal {row.journal!r}"
            raise CheckpointError(
                f"checkpoint of task {task_id!r} is corrupt: its {name} has no entry at position {len(found)}"
            )
        found.append(row.entry_json)
    return texts


_unstructure_head = make_dict_unstructure_fn(
    Checkpoint,
    converter,
    journal=override(omit=True),
    branch_journals=override(omit=True),
    _stored_lengths=override(omit=True),
    _stored_open=override(omit=True),
    _resized=override(omit=True),
)
converter.register_unstructure_hook(Checkpoint, _unstructure_head)
