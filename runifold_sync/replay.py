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
from collections.abc import Callable
from typing import Any

import attrs

from .checkpoint import Checkpoint, EntryKind, EntryStatus, JournalEntry
from .errors import NonDeterminism
from .interrupts import FailRequested


@attrs.frozen
class Call:
    """One call at its journal position: its id and the entry recorded for it, if any."""

    call_id: str
    entry: JournalEntry | None

    @property
    def replayed(self) -> bool:
        """Recorded as finished: the caller returns the entry's output and runs nothing."""
        return self.entry is not None and self.entry.status is EntryStatus.DONE


class Cursor:
    """A position in one journal: the main function's, or one parallel branch's. Entries
    change under ``lock``, the lock of the claim's checkpoint, so a commit made by another
    branch meanwhile encodes each journal whole."""

    def __init__(
        self, journal: list[JournalEntry], lock: threading.RLock, task_id: str, scope: str | None = None
    ) -> None:
        self.journal = journal
        self.lock = lock
        self.task_id = task_id
        self.scope = scope  # the branch key, None in the main function
        self._prefix = "" if scope is None else f"{scope}/"
        self._position = 0
        self._occurrences: Counter[str] = Counter()

    @classmethod
    def of_branch(cls, checkpoint: Checkpoint, key: str, lock: threading.RLock, task_id: str) -> Cursor:
        """A cursor at the start of branch ``key``'s journal (made empty on first use)."""
        with lock:
            journal = checkpoint.branch_journals.setdefault(key, [])
        return cls(journal, lock, task_id, key)

    @property
    def position(self) -> int:
        return self._position

    def take(self, name: str, kind: EntryKind) -> Call:
        """The next call, named ``name``, of ``kind``: its call id and recorded entry. A
        finished entry is passed at once; an unfinished one stays under the cursor until
        ``finish``. Fails closed when the position records another call."""
        self._occurrences[name] += 1
        call_id = f"{self._prefix}{name}#{self._occurrences[name]}"
        position = self._position
        if position >= len(self.journal):
            return Call(call_id, None)
        entry = self.journal[position]
        if entry.call_id != call_id or entry.kind != kind:
            raise FailRequested(
                str(NonDeterminism(self.task_id, position, entry.call_id, call_id)),
                cause="nondeterminism",
            )
        if entry.status is EntryStatus.DONE:
            self._position += 1
        return Call(call_id, entry)

    def record(self, entry: JournalEntry) -> None:
        """Append the finished entry of a new call and move past it."""
        with self.lock:
            self.journal.append(entry)
        self._position += 1

    def begin(self, entry: JournalEntry) -> None:
        """Append the unfinished entry of a new call; the cursor stays on it."""
        with self.lock:
            self.journal.append(entry)

    def finish(self, entry: JournalEntry, output: Any, evidence: str | None = None) -> None:
        """Finish the entry under the cursor with ``output`` (and, for an effect, how its
        result became known), and move past it."""
        with self.lock:
            entry.status = EntryStatus.DONE
            entry.output = output
            if evidence is not None:
                entry.evidence = evidence
        self._position += 1

    def drop(self, entry: JournalEntry) -> None:
        """Take an unfinished entry back out, as if its call had never been made."""
        with self.lock:
            self.journal.remove(entry)


def replay_or_run(
    cursor: Cursor,
    name: str,
    kind: EntryKind,
    run: Callable[[str], Any],
    save: Callable[[JournalEntry], None],
) -> tuple[Any, bool]:
    """The rule for a call that is either finished or not started (a step): the recorded
    output when the journal has it, without running; else ``run(call_id)`` returns the
    output, which is recorded at the cursor and handed to ``save`` under the journal lock,
    where it is set to be committed. Returns the output and whether the call ran now."""
    call = cursor.take(name, kind)
    if call.entry is not None and call.replayed:
        return call.entry.output, False
    output = run(call.call_id)
    entry = JournalEntry(call.call_id, kind, EntryStatus.DONE, output)
    with cursor.lock:
        cursor.record(entry)
        save(entry)
    return output, True
