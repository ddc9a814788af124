"""The checkpoint: semantic progress of one task, replayed step by step.

A checkpoint is a journal of calls in the order the main function made them (and one
journal per parallel branch), plus a small head: the definition it belongs to, the run,
the phase, usage and the undo bookkeeping. Replay walks a journal with a cursor
(``replay.py``); the first call past its end runs for real. Outputs are kept in their
JSON form and structured back by the step's return annotation.

How it is stored (:meth:`Checkpoint.write`): the head lives in the task row, with the
journals' newest entries inline (their *tail*, at most ``TAIL_ENTRIES`` entries and about
``TAIL_BYTES`` in all); older entries are rows of their own. A commit writes the head and
only the rows that changed. When the tail outgrows its bounds, the commit moves it into
rows in one batch. So a short workflow writes one row per commit (its task's), a long
one the same plus a batch of rows every ``TAIL_ENTRIES`` steps: the cost of a step never
grows with the steps before it, and the size limit is per entry, not per workflow.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from ..errors import CheckpointError, CheckpointTooLarge
from .codec import canonical_text, converter, from_json, to_json
from .values import BudgetUsage, DefinitionIdentity


@attrs.frozen
class JournalRow:
    """One stored journal entry: position ``position`` of journal ``journal`` (``""`` for
    the main function's, else the parallel branch's key). A checkpoint write carries only
    the rows that changed; ``entry_json`` None deletes the row (an unfinished entry taken
    back out)."""

    journal: str
    position: int
    entry_json: str | None


# Version 2: the journals live in their own rows, the head holds the rest. Version 1 kept
# everything in one text; migration 0007 converts those in place.
FORMAT_VERSION = 2
DEFAULT_MAX_ENTRY_BYTES = 1 << 20
# Bounds of the journal entries kept inline in the head; past either, a commit moves them
# into rows. Small enough that the head of a busy task stays in one database page.
TAIL_ENTRIES = 16
TAIL_BYTES = 4096
_DECODE_CHUNK = 2048  # entries parsed at once when a claim loads a journal
MAIN = ""  # the key of the main function's journal (branches are keyed "parallel#1/a")
_MAIN_TEXT = json.dumps(MAIN)
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
    CHILD = "child"  # ctx.start_child: the child task's id
    CHILDREN = "children"  # ctx.wait_child and ctx.wait_children: how the children ended
    PATCH = "patch"  # ctx.patched: the marker of a run that took a patch's new path
    NOW = "now"  # ctx.now: the store time recorded at that point of the run
    ANY = "any"  # ctx.wait_any: which of its children, signals and timers fired first


class EntryStatus(enum.StrEnum):
    """How far a recorded call got; only a ``DONE`` entry is replayed without running."""

    DONE = "done"
    INTENT = "intent"  # an effect that was called but has no recorded result
    PENDING = "pending"  # a wait not over yet, or branches not all finished
    FAILED = "failed"  # a step or effect that failed for good: its output says how (StepFailed)


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
class CallDeadline:
    """The deadline of a step or effect with a timeout whose body was started, committed
    before the body runs: a claim that finds it knows an attempt began and never
    finished, and whether it ran past its timeout (``timeouts.py``)."""

    at: float  # store time, epoch seconds
    timeout_s: float


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
    # Calls with a timeout whose body is running (or was, under a worker that never came
    # back), by call id; left out of the head while empty.
    deadlines: dict[str, CallDeadline] = attrs.Factory(dict)
    # The details of each running call's last ``StepContext.heartbeat``, by call id, for
    # its next attempt; dropped when the call completes or fails for good.
    heartbeats: dict[str, Any] = attrs.Factory(dict)
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
    # The arguments ([args, kwargs], JSON) of completed calls whose compensation takes
    # them (``compensate_for(..., with_args=True)``), by call id; left out while empty.
    compensation_args: dict[str, Any] = attrs.Factory(dict)
    # What the store holds (see ``write``): how many leading entries of each journal are
    # rows, the text of each row stored unfinished (it may still change), the journals
    # with entries past their rows (their tail, in the head) or fewer entries than rows,
    # and the text of finished entries by id(entry), since a finished entry never changes.
    _rows: dict[str, int] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    _rows_open: dict[tuple[str, int], str] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    _tailed: set[str] = attrs.field(factory=set, init=False, eq=False, repr=False)
    _texts: dict[int, tuple[JournalEntry, str]] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # Entries given to the constructor are not stored yet (``_loaded`` says when they are).
        if self.journal or self.branch_journals:  # a new task's has none
            self._tailed.update(key for key, journal in self._journals() if journal)

    # --- journals, changed through these so a commit knows what changed -------------

    def journal_of(self, key: str) -> list[JournalEntry]:
        """The journal ``key`` (``MAIN`` or a branch key), made empty on first use."""
        if key == MAIN:
            return self.journal
        return self.branch_journals.setdefault(key, [])

    def append(self, key: str, entry: JournalEntry, output_json: str | None = None) -> None:
        """Add ``entry`` at the end of journal ``key``; ``output_json``, its output's
        canonical text when the caller has it, makes the text of a finished entry now."""
        self.journal_of(key).append(entry)
        self._tailed.add(key)
        if output_json is not None and entry.status == _DONE:
            self._texts[id(entry)] = (entry, entry_json(entry, output_json))

    def remove(self, key: str, entry: JournalEntry) -> None:
        """Take an entry back out (only ever the unfinished last one of its journal)."""
        self.journal_of(key).remove(entry)
        self._tailed.add(key)

    # --- storing -------------------------------------------------------------------

    def write(self, task_id: str, limit_bytes: int) -> CheckpointWrite:
        """The head's text (the tails inline) and the journal rows that differ from what
        the store holds, each entry refused over ``limit_bytes``. Nothing changes here:
        :meth:`stored` records the write once the store took it."""
        rows: list[JournalRow] = []
        for (key, position), stored in self._rows_open.items():
            journal = self.journal_of(key)
            if position < len(journal):
                text = self._entry_text(task_id, journal[position], limit_bytes)
                if text != stored:
                    rows.append(JournalRow(key, position, text))
        tails: dict[str, tuple[int, list[str]]] = {}
        count = tail_size = 0
        for key in sorted(self._tailed) if len(self._tailed) > 1 else self._tailed:
            journal, start = self.journal_of(key), self._rows.get(key, 0)
            if len(journal) < start:
                rows.extend(JournalRow(key, position, None) for position in range(len(journal), start))
            elif len(journal) > start:
                # Every commit writes the whole tail: a finished entry's kept text is read
                # here without a call per entry, and the texts are held to the limit one by
                # one only when together they are over it (else none of them is).
                kept = self._texts
                tail = journal[start:]
                found = [
                    cached[1]
                    if (cached := kept.get(id(entry))) is not None and cached[0] is entry
                    else self._entry_text(task_id, entry, limit_bytes)
                    for entry in tail
                ]
                size = sum(map(len, found))
                if size > limit_bytes:
                    for entry in tail:  # raises for the first one over the limit
                        self._entry_text(task_id, entry, limit_bytes)
                tails[key] = (start, found)
                count += len(found)
                tail_size += size
        if count > TAIL_ENTRIES or tail_size > TAIL_BYTES:
            for key, (start, found) in tails.items():
                rows.extend(JournalRow(key, start + n, text) for n, text in enumerate(found))
            tails = {}
        head = self._head_text(tails)
        size = len(head)  # canonical text is ASCII: its length is its size in bytes
        if size > limit_bytes:
            raise CheckpointTooLarge(task_id, "checkpoint head", size, limit_bytes)
        return CheckpointWrite(head, tuple(rows))

    def stored(self, write: CheckpointWrite) -> None:
        """Record that the store now holds ``write``."""
        if not write.journal:
            return  # the head alone: what is in rows and tails did not move
        for row in write.journal:
            key, place = row.journal, (row.journal, row.position)
            rows = self._rows.get(key, 0)
            if row.entry_json is None:
                self._rows[key] = min(rows, row.position)
                self._rows_open.pop(place, None)
                continue
            self._rows[key] = max(rows, row.position + 1)
            entry = self.journal_of(key)[row.position]
            if entry.status == _DONE:
                self._rows_open.pop(place, None)
                self._texts.pop(id(entry), None)  # a row now: never encoded again
            else:
                self._rows_open[place] = row.entry_json
        self._tailed = {key for key in self._tailed if len(self.journal_of(key)) != self._rows.get(key, 0)}

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
        return cls._decode(task_id, head_json, rows, with_journals=True)

    @classmethod
    def decode_head(cls, task_id: str, head_json: str) -> Checkpoint:
        """A stored head alone, its journals left empty: for readers of usage, run and
        phase that do not need the journal (``show`` pages it with :func:`newest_entries`)."""
        return cls._decode(task_id, head_json, (), with_journals=False)

    @classmethod
    def _decode(
        cls, task_id: str, head_json: str, rows: Iterable[JournalRow], *, with_journals: bool
    ) -> Checkpoint:
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
            stored = _journal_texts(task_id, rows)
            journals = {key: _structured_entries(found) for key, found in stored.items()}
            tails = raw.pop("journal_tail", {})
            if not with_journals:
                tails = {}
            for key, tail in tails.items():
                if tail["start"] != len(stored.get(key, ())):
                    raise CheckpointError(
                        f"checkpoint of task {task_id!r} is corrupt: {_journal_name(key)} has "
                        f"{len(stored.get(key, ()))} stored entries but its tail starts at {tail['start']}"
                    )
                journals[key] = journals.get(key, []) + converter.structure(
                    tail["entries"], list[JournalEntry]
                )
            checkpoint: Checkpoint = converter.structure(raw, cls)
            checkpoint.journal = journals.pop(MAIN, [])
            checkpoint.branch_journals = journals
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, cattrs.BaseValidationError) as exc:
            raise CheckpointError(f"checkpoint of task {task_id!r} is corrupt: {exc}") from exc
        checkpoint._loaded({key: len(found) for key, found in stored.items()}, set(tails))
        return checkpoint

    def _loaded(self, rows: dict[str, int], tailed: set[str]) -> None:
        """What was decoded is what the store holds: ``rows`` leading entries of each
        journal as rows, the rest in the tails of journals ``tailed``."""
        self._rows, self._tailed = rows, tailed
        for key, count in rows.items():
            journal = self.journal_of(key)
            for position in range(count):
                if journal[position].status != _DONE:
                    self._rows_open[(key, position)] = entry_json(journal[position])

    def _journals(self) -> Iterator[tuple[str, list[JournalEntry]]]:
        yield MAIN, self.journal
        yield from self.branch_journals.items()

    def _entry_text(self, task_id: str, entry: JournalEntry, limit_bytes: int) -> str:
        """An entry's text, refused over ``limit_bytes``; a finished entry's is kept."""
        cached = self._texts.get(id(entry))
        if cached is not None and cached[0] is entry:
            text = cached[1]
        else:
            text = entry_json(entry)
            if entry.status == _DONE:
                self._texts[id(entry)] = (entry, text)
        size = len(text)  # canonical text is ASCII: its length is its size in bytes
        if size > limit_bytes:
            raise CheckpointTooLarge(task_id, f"journal entry {entry.call_id!r}", size, limit_bytes)
        return text

    def _head_text(self, tails: dict[str, tuple[int, list[str]]]) -> str:
        """The canonical text of the head (keys sorted) with ``tails`` inline as
        ``journal_tail``: the head encoded in one call with a marker in the tails' place,
        which their entries' kept texts then replace."""
        parts = (
            f"{_MAIN_TEXT if key == MAIN else json.dumps(key)}:"
            f'{{"entries":[{",".join(texts)}],"start":{start}}}'
            for key, (start, texts) in tails.items()
        )
        raw = _unstructure_head(self)
        raw["journal_tail"] = _TAIL_MARK
        return canonical_text(raw).replace(_TAIL_MARK_TEXT, f'"journal_tail":{{{",".join(parts)}}}', 1)


def entry_json(entry: JournalEntry, output_json: str | None = None) -> str:
    """An entry's canonical text, its fields taken as they are: its output is already
    in its JSON form (a step's as its text reads back, or as stored), so it is encoded
    once rather than walked by cattrs first, which took longer than the encoding itself.
    ``output_json``, the output's canonical text, is put in its place unencoded.
    The fields are named here rather than looked up by name (a test checks they are
    all of JournalEntry's): every step encodes an entry."""
    fields = {
        "call_id": entry.call_id,
        "kind": entry.kind,
        "status": entry.status,
        "output": entry.output,
        "key": entry.key,
        "due": entry.due,
        "evidence": entry.evidence,
    }
    if output_json is None:
        return to_json(fields)
    # Encoded with a null output, which the text then replaces: inside a string every
    # quote is escaped, so the key's own '"output":null' is the only one there is.
    fields["output"] = None
    return to_json(fields).replace('"output":null', f'"output":{output_json}', 1)


def _structured_entries(texts: list[str]) -> list[JournalEntry]:
    """Stored entry texts as entries. Parsed a chunk at a time: joined, texts parse many
    times faster than one by one, and a chunk's intermediate dicts are all that a long
    journal holds besides its entries."""
    entries: list[JournalEntry] = []
    for start in range(0, len(texts), _DECODE_CHUNK):
        parsed = from_json(f"[{','.join(texts[start : start + _DECODE_CHUNK])}]")
        entries.extend(converter.structure(parsed, list[JournalEntry]))
    return entries


def _journal_name(key: str) -> str:
    return "its main journal" if key == MAIN else f"its journal {key!r}"


def _journal_texts(task_id: str, rows: Iterable[JournalRow]) -> dict[str, list[str]]:
    """Each journal's stored entry texts in order; a gap or a repeat fails closed."""
    texts: dict[str, list[str]] = {}
    for row in rows:
        found = texts.setdefault(row.journal, [])
        if row.position != len(found) or row.entry_json is None:
            raise CheckpointError(
                f"checkpoint of task {task_id!r} is corrupt: {_journal_name(row.journal)} has no "
                f"entry at position {len(found)}"
            )
        found.append(row.entry_json)
    return texts


_PRIVATE = ("_rows", "_rows_open", "_tailed", "_texts")
# Left out of the head while empty (decoding gives the defaults back; the store's SQL
# reads a missing undo or compensated list as empty): most heads have nothing in them,
# and every commit encodes its head anew.
_OMITTED_WHILE_EMPTY = (
    "deadlines",
    "heartbeats",
    "step_failures",
    "branch_usage",
    "compensating_for",
    "compensation_reason",
    "compensated",
    "undo",
    "compensation_args",
)
_unstructure_head = make_dict_unstructure_fn(
    Checkpoint,
    converter,
    journal=override(omit=True),
    branch_journals=override(omit=True),
    **{name: override(omit_if_default=True) for name in _OMITTED_WHILE_EMPTY},  # type: ignore[arg-type]
    **{name: override(omit=True) for name in _PRIVATE},  # type: ignore[arg-type]
)
converter.register_unstructure_hook(Checkpoint, _unstructure_head)


# Stands for the tails while the head is encoded. The engine alone writes the top-level
# "journal_tail" key, and no value a store keeps holds U+0000, so the marker's text occurs
# exactly once.
_TAIL_MARK = "\x00journal tail\x00"
_TAIL_MARK_TEXT = f'"journal_tail":{json.dumps(_TAIL_MARK)}'
