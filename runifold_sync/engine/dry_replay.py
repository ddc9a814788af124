"""A dry replay: would this code continue this recorded run?

The deploy gate (``versions --app NEW --replay``), ``upgrade`` and
``runifold_sync.testing.replay`` run a task's main function under the new code against
the journal it recorded, as a claim's replay would, and stop where a claim would start
doing something new: past the journal's end, or at a call recorded unfinished (an effect's
intent, a wait not over, branches not all finished). So no step body, effect, commit or
store write ever happens: every durable call takes its journal position first
(``replay.Cursor.take``) and a dry cursor stops there.

What it finds: nothing (the code makes the recorded calls, in order, with outputs that
still fit their types), or the first divergence: the position, the call recorded there and
the call the new code makes instead (or that it returns before reaching it).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import attrs

from ..errors import NonDeterminism
from ..model.checkpoint import Checkpoint, EntryKind, EntryStatus, JournalEntry
from ..model.codec import from_json, structure
from ..model.values import Budget
from ..store.base import WorkflowStore
from ..store.records import ClaimedTask, Lease
from ..workflow.context import Branches
from ..workflow.registry import WorkflowDefinition
from ..workflow.specs import return_type
from .claim import Claim
from .interrupts import ContinueRequested, FailRequested, Interrupt, UnknownPatch
from .replay import Cursor
from .task_run import TaskRun

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ReachedEnd(Interrupt):
    """The dry replay reached the point where a claim would run something new."""


@attrs.frozen
class Divergence:
    """Where new code stops matching a recorded run: at ``position`` of journal
    ``journal`` (``""`` for the main function's) the run recorded ``recorded`` and the
    code does ``new``; ``reason`` says it in a sentence."""

    position: int
    recorded: str
    new: str
    reason: str
    journal: str = ""


class _DryCursor(Cursor):
    """A cursor that replays finished entries and stops (``ReachedEnd``) where a call
    would run or continue for real."""

    @property
    def replaying(self) -> bool:
        return True  # ctx.set_event never writes

    def take(self, name: str, kind: EntryKind) -> tuple[str, JournalEntry | None]:
        if self.position >= len(self.journal):
            raise ReachedEnd()
        call_id, entry = super().take(name, kind)
        # A step's recorded final failure replays as its StepFailed, as a claim does.
        if entry is None or entry.status not in (EntryStatus.DONE, EntryStatus.FAILED):
            raise ReachedEnd()
        return call_id, entry

    def take_unfinished(self, name: str, kind: EntryKind) -> tuple[str, JournalEntry]:
        """As :meth:`take`, but an unfinished entry is handed back rather than stopped at
        (a parallel call some of whose branches are still to finish)."""
        if self.position >= len(self.journal):
            raise ReachedEnd()
        call_id, entry = super().take(name, kind)
        assert entry is not None
        return call_id, entry

    def patch(self, change_id: str, *, record: bool = True) -> bool:
        if record and change_id not in self._patches and self.position >= len(self.journal):
            raise ReachedEnd()  # a run reaching the call now: the new path, for real
        return super().patch(change_id, record=record)


class _DryRun(TaskRun):
    cursor_type = _DryCursor

    def parallel(
        self, branches: Branches, reserve: Mapping[str, Budget] | None, max_threads: int
    ) -> dict[str, Any]:
        """A finished parallel call answers its recorded results, as in a claim. One
        still running (a branch's step to be retried) has each unfinished branch's
        journal replayed, in turn on this thread, then stops: a change inside a branch
        that has recorded calls is found too."""
        cursor = self.cursor
        assert isinstance(cursor, _DryCursor)
        call_id, entry = cursor.take_unfinished(EntryKind.PARALLEL.value, EntryKind.PARALLEL)
        if entry.status == EntryStatus.DONE:
            return {key: structure(entry.output[key], return_type(fn)) for key, fn in branches.items()}
        finished = entry.output or {}
        for key, fn in branches.items():
            if key in finished:
                continue
            branch = self.branch(f"{call_id}/{key}", None, threading.Event(), {})
            try:
                fn(branch.context)
            except ReachedEnd:
                continue
        raise ReachedEnd()


class _NoStore:
    """What a dry replay has for a store: any use is a bug of the dry cursor, loudly."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a dry replay must not use the store, but asked for store.{name}")


def dry_replay(
    definition: WorkflowDefinition,
    task_id: str,
    input_json: str,
    checkpoint: Checkpoint,
) -> Divergence | None:
    """Replay ``checkpoint`` (task ``task_id``'s, started with ``input_json``) against
    ``definition``'s main function without running anything; the first divergence, or
    None when the code can continue the run. No store is needed: only a call that would
    run uses one, and the replay stops before it."""
    checkpoint = attrs.evolve(checkpoint, definition=definition.identity)
    lease = Lease(task_id, "dry-replay", "dry-replay", 0, _EPOCH)
    claimed = ClaimedTask(
        lease=lease,
        definition_name=definition.identity.name,
        definition_version=definition.identity.version,
        input_json=input_json,
        revision=0,
        checkpoint_json=None,
        claims_since_progress=0,
        resolutions={},
        due_at=_EPOCH,
        claimed_at=_EPOCH,
        from_state="queued",
    )
    claim = Claim(claimed, max_entry_bytes=1 << 30)
    run = _DryRun.open(claim, definition, checkpoint, cast(WorkflowStore, _NoStore()))
    main = definition.workflow.main_fn
    assert main is not None
    raw = from_json(input_json)
    try:
        workflow_input = definition.structure_input(raw)
    except Exception:
        workflow_input = attrs.evolve(definition, coerce_input=True).structure_input(raw)
    journal = checkpoint.journal
    try:
        main(run.context, workflow_input)
    except ReachedEnd:
        return None
    except ContinueRequested:
        return _ended_early(run, journal, "continues as new")
    except UnknownPatch as unknown:
        return Divergence(
            unknown.position,
            unknown.marker,
            unknown.call_id,
            f"the run took patch {unknown.marker!r}, which the new code does not check at "
            f"that point (it calls {unknown.call_id!r})",
        )
    except FailRequested as failure:
        error = failure.error
        if isinstance(error, NonDeterminism):
            key = error.recorded.rpartition("/")[0]  # a parallel branch's call: its journal
            where = checkpoint.branch_journals.get(key, []) if key else journal
            recorded = where[error.position] if error.position < len(where) else None
            shown = error.recorded if recorded is None else f"{recorded.kind} {recorded.call_id}"
            return Divergence(error.position, shown, error.requested, str(error), key)
        return Divergence(
            run.cursor.position,
            _at(journal, run.cursor.position),
            f"fails: {failure.reason}",
            f"the new code fails the run at call {run.cursor.position}: {failure.reason}",
        )
    except Interrupt as interrupt:  # a wait or cancel that a finished entry should have answered
        return Divergence(
            run.cursor.position,
            _at(journal, run.cursor.position),
            type(interrupt).__name__,
            f"the new code stops at call {run.cursor.position} ({type(interrupt).__name__})",
        )
    except Exception as exc:
        return Divergence(
            run.cursor.position,
            _at(journal, run.cursor.position),
            f"raises {type(exc).__name__}",
            f"the new code raises {type(exc).__name__}: {exc} after replaying "
            f"{run.cursor.position} recorded call(s)",
        )
    return _ended_early(run, journal, "returns")


def _at(journal: list[JournalEntry], position: int) -> str:
    if position < len(journal):
        entry = journal[position]
        return f"{entry.kind} {entry.call_id}"
    return "(end of journal)"


def _ended_early(run: TaskRun, journal: list[JournalEntry], how: str) -> Divergence | None:
    """The code ended the run: fine when every recorded call was replayed."""
    position = run.cursor.position
    if position >= len(journal):
        return None
    return Divergence(
        position,
        _at(journal, position),
        how,
        f"the new code {how} at call {position}, where the run recorded {_at(journal, position)}",
    )
