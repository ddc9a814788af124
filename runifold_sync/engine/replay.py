"""The replay rule: a recorded call returns its output, the first new call runs and commits.

The main function runs from the top on every claim, and so does each parallel branch.
Every durable call it makes (step, effect, timer, signal wait, parallel, race) takes the
next position of its journal through a ``Cursor``:

- an entry recorded there as finished (``DONE``) is the call's result: the cursor moves
  past it and the caller returns its output without running anything;
- an unfinished entry (an effect's intent, a wait not over, branches not all finished) is
  handed back for its kind to continue (``calls.py``, ``waits.py``, ``branches.py``);
- past the end of the journal the call is new: it runs, and its entry is recorded at the
  cursor and committed (``commits.py``) before the function goes on, so a completed call
  never runs twice and at most the call in flight is lost in a crash;
- an entry recorded for a different call fails the task closed: the code no longer makes
  the calls its checkpoint recorded (non-determinism), and a checkpoint is never
  reinterpreted as another graph.

Call ids are ``<name>#<n>`` for the n-th call of that name in the journal, prefixed by the
branch key (``parallel#1/a/``) in a branch's journal.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from ..errors import NonDeterminism
from ..model.checkpoint import MAIN, Checkpoint, EntryKind, EntryStatus, JournalEntry
from .interrupts import FailRequested, UnknownPatch

# Bound once: on Python 3.11 reading an enum member from its class is a Python-level
# lookup that cost more than the rest of a replayed call's checks.
_DONE = EntryStatus.DONE
_FAILED = EntryStatus.FAILED
_PATCH = EntryKind.PATCH


def patch_call_id(change_id: str) -> str:
    """The call id of a patch's marker (one per journal, however often it is asked)."""
    return f"patch:{change_id}"


def finished(entry: JournalEntry | None) -> bool:
    """A recorded entry of a finished call: its output is the call's result."""
    return entry is not None and entry.status == _DONE


class Cursor:
    """A position in one journal of ``checkpoint``: the main function's (``MAIN``), or
    one parallel branch's. Entries change under ``lock``, the lock of the claim's
    checkpoint, so a commit made by another branch meanwhile sees each journal whole."""

    def __init__(
        self, checkpoint: Checkpoint, lock: threading.RLock, task_id: str, scope: str | None = None
    ) -> None:
        self.checkpoint = checkpoint
        self.key = MAIN if scope is None else scope
        with lock:
            self.journal = checkpoint.journal_of(self.key)  # a branch's is made empty on first use
        self.lock = lock
        self.task_id = task_id
        self.scope = scope  # the branch key, None in the main function
        self._prefix = "" if scope is None else f"{scope}/"
        self._position = 0
        self._occurrences: Counter[str] = Counter()
        self._patches: dict[str, bool] = {}  # what ctx.patched answered in this journal

    @property
    def position(self) -> int:
        return self._position

    @property
    def replaying(self) -> bool:
        """Calls are recorded past this position: the code here ran in an earlier claim
        before they were, and what it committed then (an event it published) stands."""
        return self._position < len(self.journal)

    def take(self, name: str, kind: EntryKind) -> tuple[str, JournalEntry | None]:
        """The next call, named ``name``, of ``kind``: its call id and its recorded entry
        (None for a new call). A finished entry is passed at once; an unfinished one stays
        under the cursor until ``finish``. Fails closed when the position records another
        call. (A plain tuple: one is made for every call on every replay.)"""
        self._occurrences[name] += 1
        call_id = f"{self._prefix}{name}#{self._occurrences[name]}"
        position = self._position
        if position >= len(self.journal):
            return call_id, None
        entry = self.journal[position]
        if entry.kind != kind or entry.call_id != call_id:
            if entry.kind is _PATCH:  # the run took a patch's new path this code lacks
                raise UnknownPatch(entry.call_id, position, call_id)
            error = NonDeterminism(self.task_id, position, entry.call_id, call_id)
            raise FailRequested(str(error), cause="nondeterminism", error=error, step_id=name)
        if entry.status == _DONE or entry.status == _FAILED:  # both replay without running
            self._position += 1
        return call_id, entry

    def patch(self, change_id: str, *, record: bool = True) -> bool:
        """``ctx.patched(change_id)``: True when the run records (or recorded) the patch's
        marker here, False when its journal already goes on past this point without it.
        The first answer in a journal stands for every later call with that id. With
        ``record`` False (``ctx.deprecate_patch``) a marker found here is passed and none
        is made."""
        decided = self._patches.get(change_id)
        if decided is not None:
            return decided
        call_id = f"{self._prefix}{patch_call_id(change_id)}"
        position = self._position
        if position < len(self.journal):
            entry = self.journal[position]
            decided = entry.kind is _PATCH and entry.call_id == call_id
            if decided:
                self._position += 1
        elif record:
            self.record(JournalEntry(call_id, _PATCH, _DONE, output=True))
            decided = True
        else:
            decided = False
        self._patches[change_id] = decided
        return decided

    def record(self, entry: JournalEntry, output_json: str | None = None) -> None:
        """Append the finished entry of a new call and move past it; ``output_json`` is
        its output's canonical text, when the caller has it."""
        with self.lock:
            self.checkpoint.append(self.key, entry, output_json)
        self._position += 1

    def begin(self, entry: JournalEntry) -> None:
        """Append the unfinished entry of a new call; the cursor stays on it."""
        with self.lock:
            self.checkpoint.append(self.key, entry)

    def finish(self, entry: JournalEntry, output: Any, evidence: str | None = None) -> None:
        """Finish the entry under the cursor with ``output`` (and, for an effect, how its
        result became known), and move past it."""
        with self.lock:
            entry.status = EntryStatus.DONE
            entry.output = output
            if evidence is not None:
                entry.evidence = evidence
        self._position += 1

    def fail(self, entry: JournalEntry | None, failed: JournalEntry) -> None:
        """Record ``failed``, the final failure of the call under the cursor: in place of
        its unfinished ``entry`` (an effect's intent), else appended; and move past it."""
        with self.lock:
            if entry is None:
                self.checkpoint.append(self.key, failed)
            else:
                entry.status = EntryStatus.FAILED
                entry.output = failed.output
        self._position += 1

    def drop(self, entry: JournalEntry) -> None:
        """Take an unfinished entry back out, as if its call had never been made."""
        with self.lock:
            self.checkpoint.remove(self.key, entry)
