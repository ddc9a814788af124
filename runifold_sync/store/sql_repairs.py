"""Repairing runs: fork a run from one of its steps, resume a cancelled task, and retry or
cancel the tasks a filter selects, each written once over a :class:`Dialect`.

- ``fork`` makes a new task whose journal is the original's up to the named step: the
  calls before it are replayed (their effects are not repeated), the rest runs anew. The
  original is untouched; both histories name the other. A fork at or after an effect
  whose outcome is unknown is refused: the new run would have to decide it by guessing.
- ``resume_cancelled`` queues a cancelled task again from its checkpoint; refused when
  the cancellation ran (or began) the workflow's compensations, whose undo a resumed run
  would build on.
- ``retry_where`` / ``cancel_where`` walk the tasks a :class:`TaskSelector` matches in
  creation order, a bounded batch per transaction, each task audited once; a task the
  action does not apply to is skipped with why. A crash between batches leaves every
  batch whole, and running the same command again goes on with the tasks still matching.

Each writes its rows, history events and NOTIFY in one transaction, with the crash point
``within_operator`` (subject: the operation) before its commit and ``after_operator``
after it (``model/crashpoints.py``).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from ..errors import InvalidArgument, InvalidState, TaskNotFound
from ..model import crashpoints, validate
from ..model.checkpoint import (
    DEFAULT_MAX_ENTRY_BYTES,
    Checkpoint,
    EntryKind,
    EntryStatus,
    JournalEntry,
    JournalRow,
)
from ..model.codec import from_json, to_json
from ..model.values import DefinitionIdentity, TaskState, WorkflowTask
from . import checks, event_details, row_records
from .dialect import Dialect, Event, Transaction
from .repair_records import FIRST_IDS, MAX_REDRIVE_BATCH, Redrive, TaskSelector
from .retries import retried
from .sql_operators import insert_tasks

Progress = Callable[[int, int], None]  # (tasks looked at so far, tasks matched at the start)


def _operator_point(point: str, operation: str) -> None:
    if crashpoints.ARMED:
        crashpoints.reached(point, operation)


class RepairOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect

    def _cancel_in(self, tx: Transaction, task_id: str, actor: str, reason: str) -> TaskState:
        raise NotImplementedError  # OperatorOperations'

    # --- fork ------------------------------------------------------------------------

    def fork(
        self,
        task_id: str,
        *,
        from_step: str,
        input: Any = None,
        actor: str,
        reason: str,
        definition: DefinitionIdentity | None = None,
        new_task_id: str | None = None,
    ) -> str:
        """Start a new task from task ``task_id``'s run as it was before its call
        ``from_step`` (a call id such as ``"charge#1"``, or a step id for its first
        call): its journal up to there is copied and replayed, not run again, and the
        run goes on from that call. ``input`` replaces the original input (None: the
        same). ``definition`` (a registry's ``WorkflowDefinition.identity``) runs it as
        that version of the same workflow, whose code must replay the copied calls
        (``versions --replay`` checks it); default the original's. Returns the new
        task's id (``new_task_id``, else ``<task id>.fork-<random>``). Refused
        (:class:`InvalidState`) for a task that never ran and at or after an effect
        whose outcome is unknown."""
        checks.operator(actor, reason)
        validate.text("task id", task_id)
        validate.name("from_step", from_step)
        validate.optional(validate.is_a(DefinitionIdentity))("fork definition", definition)
        new_id = validate.optional(validate.text)("new_task_id", new_task_id)
        d = self.dialect

        def fork() -> str:
            with d.transaction() as tx:
                record = row_records.found_task(d, tx.one("select_task", {"task_id": task_id}), task_id)
                if record.checkpoint_json is None:
                    raise InvalidState(f"task {task_id!r} has not run yet: there is no journal to fork")
                rows = tx.all("journal_rows", {"task_id": task_id})
                stored = [JournalRow(r["journal"], r["position"], r["entry"]) for r in rows]
                original = Checkpoint.decode(task_id, record.checkpoint_json, stored)
                identity = original.definition if definition is None else definition
                if identity.name != record.definition_name:
                    raise InvalidArgument(
                        f"a fork of {record.definition_name!r} must run the same workflow, "
                        f"not {identity.name!r}"
                    )
                if identity.version < record.definition_version:
                    raise InvalidArgument(
                        f"a fork runs the same or a newer version: task {task_id!r} is version "
                        f"{record.definition_version}, not {identity.version}"
                    )
                forked = forked_checkpoint(task_id, original, from_step, identity)
                fork_id = new_id or f"{task_id}.fork-{uuid.uuid4().hex[:12]}"
                task = WorkflowTask.new(
                    identity.name,
                    identity.version,
                    record.input if input is None else input,
                    tenant=record.tenant,
                    priority=record.priority,
                    checkpoint_id=fork_id,
                    queue=record.queue,
                )
                [created] = insert_tasks(d, tx, [task])
                if not created.created:
                    raise InvalidArgument(f"new_task_id {fork_id!r} names a task that exists already")
                write = forked.write(fork_id, DEFAULT_MAX_ENTRY_BYTES)
                tx.count(
                    "fork_head",
                    {
                        "task_id": fork_id,
                        "head": d.json_in("checkpoint", write.head_json),
                        "fingerprint": identity.fingerprint,
                    },
                )
                for row in write.journal:
                    if row.entry_json is not None:
                        entry = d.json_in("journal entry", row.entry_json)
                        params = {"task_id": fork_id, "journal": row.journal, "position": row.position}
                        tx.count("fork_journal_entry", params | {"entry": entry})
                at = tx.now()
                about = {"from_step": from_step} | event_details.operator(actor, d.free_text(reason))
                d.event(tx, Event(fork_id, at, "forked_from", {"task": task_id} | about))
                d.event(tx, Event(task_id, at, "forked", {"task": fork_id} | about))
                _operator_point("within_operator", "fork")
            return fork_id

        forked_id = retried(fork) if new_id is not None else fork()  # a fresh id must not be sent twice
        _operator_point("after_operator", "fork")
        return forked_id

    # --- resuming a cancelled task -----------------------------------------------------

    def resume_cancelled(self, task_id: str, *, actor: str, reason: str) -> TaskState:
        """Queue cancelled task ``task_id`` again: its next claim replays its checkpoint
        and goes on from where the cancel stopped it. Refused (:class:`InvalidState`)
        for a task that is not cancelled, and for one whose cancellation ran (or began)
        its compensations. Its children cancelled with it stay cancelled."""
        checks.operator(actor, reason)
        d = self.dialect
        with d.transaction() as tx:
            params = {"task_id": validate.text("task id", task_id)}
            if tx.one("lock_task", params) is None:
                raise TaskNotFound(task_id)
            record = row_records.found_task(d, tx.one("select_task", params), task_id)
            if record.state is not TaskState.CANCELLED:
                raise InvalidState(
                    f"task {task_id!r} is {record.state.value}, not cancelled: nothing to resume"
                )
            if record.checkpoint_json is not None:
                head = Checkpoint.decode_head(task_id, record.checkpoint_json)
                if head.compensating_for is not None:
                    raise InvalidState(
                        f"task {task_id!r} cannot be resumed: its cancellation ran compensations "
                        f"({len(head.compensated)} undone), which a resumed run would not redo"
                    )
            resumed = tx.one("resume_cancelled", params)
            assert resumed is not None  # locked and cancelled
            detail = {"from": "cancelled"} | event_details.operator(actor, d.free_text(reason))
            d.event(tx, Event(task_id, resumed["at"], "resumed", detail))
            d.notify(tx)
            _operator_point("within_operator", "resume_cancelled")
        _operator_point("after_operator", "resume_cancelled")
        return TaskState.QUEUED

    # --- moving a task to a newer version ----------------------------------------------

    def upgrade_task(
        self, task_id: str, definition: DefinitionIdentity, *, revision: int, actor: str, reason: str
    ) -> bool:
        """Move queued or waiting task ``task_id`` onto ``definition`` (a newer version of
        its workflow, a registry's ``WorkflowDefinition.identity``), if it is still at
        ``revision`` (when the caller replayed its journal against that version: the
        ``upgrade`` command). False, changing nothing, when it moved on, is leased, or
        is of another version meanwhile; the caller lists it as not moved."""
        checks.operator(actor, reason)
        validate.text("task id", task_id)
        validate.instance("upgrade definition", definition, DefinitionIdentity)
        validate.stored_int("revision", revision, minimum=0)
        d = self.dialect
        with d.transaction() as tx:
            record = row_records.found_task(d, tx.one("select_task", {"task_id": task_id}), task_id)
            if record.definition_name != definition.name:
                raise InvalidArgument(
                    f"task {task_id!r} is of {record.definition_name!r}, not {definition.name!r}"
                )
            if record.definition_version >= definition.version:
                raise InvalidArgument(
                    f"task {task_id!r} is version {record.definition_version}: an upgrade moves it to "
                    f"a newer one, not {definition.version}"
                )
            head = None
            if record.checkpoint_json is not None:
                raw = from_json(record.checkpoint_json)
                raw["definition"] = attrs.asdict(definition)
                head = d.json_in("checkpoint", to_json(raw))
            params = {
                "task_id": task_id,
                "version": definition.version,
                "from_version": record.definition_version,
                "head": head,
                "fingerprint": definition.fingerprint if head is not None else record.fingerprint,
                "revision": revision,
            }
            moved = tx.one("upgrade_task", params)
            if moved is None:
                return False
            detail = {"from_version": record.definition_version, "to_version": definition.version}
            d.event(
                tx, Event(task_id, moved["at"], "upgraded", detail | event_details.operator(actor, reason))
            )
            d.notify(tx)
            _operator_point("within_operator", "upgrade")
        _operator_point("after_operator", "upgrade")
        return True

    # --- retry and cancel by filter -----------------------------------------------------

    def retry_where(
        self,
        selector: TaskSelector,
        *,
        actor: str,
        reason: str,
        batch: int = 100,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> Redrive:
        """Requeue every failed task ``selector`` matches (as :meth:`requeue` does one),
        ``batch`` per transaction; a matched task that is not failed, or failed on an
        ambiguous effect (``resolve_effect`` decides that one), is skipped with why.
        ``dry_run``: change nothing, count the matches and name the first ones.
        ``progress(looked at, matched)`` is called after each batch."""
        return self._redrive("retry", selector, actor, reason, batch, dry_run, progress)

    def cancel_where(
        self,
        selector: TaskSelector,
        *,
        actor: str,
        reason: str,
        batch: int = 100,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> Redrive:
        """Cancel every unfinished task ``selector`` matches (as :meth:`cancel` does
        one, children included), ``batch`` per transaction; finished ones are skipped.
        ``dry_run`` and ``progress`` as for :meth:`retry_where`."""
        return self._redrive("cancel", selector, actor, reason, batch, dry_run, progress)

    def _redrive(
        self,
        action: str,
        selector: TaskSelector,
        actor: str,
        reason: str,
        batch: int,
        dry_run: bool,
        progress: Progress | None,
    ) -> Redrive:
        checks.operator(actor, reason)
        validate.instance("selector", selector, TaskSelector)
        batch = validate.integer("batch", batch, minimum=1, maximum=MAX_REDRIVE_BATCH)
        validate.flag("dry_run", dry_run)
        d = self.dialect
        filters = _filter_params(d, selector)
        window = {"after_at": None, "after_id": None}
        matched = retried(lambda: d.all("count_matching", filters))[0]["tasks"]
        if dry_run:
            first = d.all("select_matching", filters | window | {"limit": FIRST_IDS})
            return Redrive(int(matched), 0, tuple(r["task_id"] for r in first), dry_run=True)
        changed: list[str] = []
        skipped: list[tuple[str, str]] = []
        counts = {"changed": 0, "skipped": 0, "looked": 0}
        while True:
            with d.transaction() as tx:
                found = tx.all("select_matching", filters | window | {"limit": batch})
                if not found:
                    break
                for row in found:
                    task_id = row["task_id"]
                    why = (
                        self._retry_in(tx, task_id, actor, reason)
                        if action == "retry"
                        else (self._cancel_one(tx, task_id, actor, reason))
                    )
                    if why is None:
                        counts["changed"] += 1
                        if len(changed) < FIRST_IDS:
                            changed.append(task_id)
                    else:
                        counts["skipped"] += 1
                        if len(skipped) < FIRST_IDS:
                            skipped.append((task_id, why))
                _operator_point("within_operator", f"{action}_batch")
            _operator_point("after_operator", f"{action}_batch")
            last = found[-1]
            window = {"after_at": last["created_at"], "after_id": last["task_id"]}
            counts["looked"] += len(found)
            if progress is not None:
                progress(counts["looked"], int(matched))
        return Redrive(int(matched), counts["changed"], tuple(changed), tuple(skipped), counts["skipped"])

    def _retry_in(self, tx: Transaction, task_id: str, actor: str, reason: str) -> str | None:
        """Requeue ``task_id`` in ``tx`` with its audit event; why not, when it cannot be."""
        d = self.dialect
        changed = tx.one("requeue_failed", {"task_id": task_id})
        if changed is None:
            record = row_records.found_task(d, tx.one("select_task", {"task_id": task_id}), task_id)
            if record.ambiguous_effect is not None:
                return f"failed on ambiguous effect {record.ambiguous_effect}: resolve it instead"
            return (
                f"{record.state.value}"
                + (f" ({record.outcome.value})" if record.outcome else "")
                + ", not failed"
            )
        d.event(
            tx, Event(task_id, changed["at"], "requeued", event_details.operator(actor, d.free_text(reason)))
        )
        d.notify(tx)
        return None

    def _cancel_one(self, tx: Transaction, task_id: str, actor: str, reason: str) -> str | None:
        row = tx.one("lock_task", {"task_id": task_id})
        if row is None or row["state"] not in ("queued", "leased", "waiting"):
            return "finished" if row is None else f"{row['state']}: finished"
        try:
            self._cancel_in(tx, task_id, actor, reason)
        except InvalidState as exc:
            return str(exc)
        return None


def _filter_params(d: Dialect, selector: TaskSelector) -> dict[str, Any]:
    return {
        "definition": selector.definition,
        "version": selector.version,
        "state": None if selector.state is None else selector.state.value,
        "outcome": None if selector.outcome is None else selector.outcome.value,
        "reason_text": selector.reason_contains,
        "tenant": selector.tenant,
        "queue": selector.queue,
        "since": None if selector.since is None else d.db_time(selector.since),
        "until": None if selector.until is None else d.db_time(selector.until),
    }


def forked_checkpoint(
    task_id: str, original: Checkpoint, from_step: str, identity: DefinitionIdentity
) -> Checkpoint:
    """The checkpoint of a fork: the original's main journal before call ``from_step``
    (and the branch journals of the parallel calls kept), its undo list cut to match."""
    journal = original.journal
    wanted = from_step if "#" in from_step else f"{from_step}#1"
    cut = next((n for n, e in enumerate(journal) if e.call_id == wanted), None)
    if cut is None:
        recorded = ", ".join(e.call_id for e in journal[:20]) or "none"
        raise InvalidArgument(
            f"from_step {from_step!r}: task {task_id!r} recorded no call {wanted!r} (its calls: {recorded})"
        )
    for position, entry in enumerate(journal[: cut + 1]):
        if entry.kind is EntryKind.EFFECT and entry.status is not EntryStatus.DONE:
            raise InvalidState(
                f"cannot fork task {task_id!r} at {wanted!r}: effect {entry.call_id!r} (call {position}) "
                f"has an unknown outcome; resolve it first (resolve_effect), or fork before it"
            )
        if position < cut and entry.status is not EntryStatus.DONE:
            raise InvalidState(
                f"cannot fork task {task_id!r} at {wanted!r}: {entry.call_id!r} before it is unfinished"
            )
    kept: list[JournalEntry] = copy.deepcopy(journal[:cut])
    branch_keys = [f"{e.call_id}/" for e in kept if e.kind in (EntryKind.PARALLEL, EntryKind.RACE)]
    branches = {
        key: copy.deepcopy(entries)
        for key, entries in original.branch_journals.items()
        if any(key.startswith(prefix) for prefix in branch_keys)
    }
    kept_ids = {e.call_id for e in kept}
    undo = [c for c in original.undo if c in kept_ids or any(c.startswith(prefix) for prefix in branch_keys)]
    return Checkpoint(identity, journal=kept, branch_journals=branches, undo=undo)
