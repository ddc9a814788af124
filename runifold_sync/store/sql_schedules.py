"""The schedule operations of the shared SQL store: declaring a registry's schedules,
creating one tick's task, pause, resume and removal, and the reads, each written once
over a :class:`Dialect`.

A tick's task is created with the schedule row's ``last_tick`` in one transaction that
first locks the row (PostgreSQL ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` holds the
database), so however many pools reach the same tick at once, one creates it and the
others find ``last_tick`` at it. The task id (``schedule:<name>:<tick>``) would keep the
task single on its own; the row also keeps a tick from being created again after its task
is gone (pruned), and a paused schedule from creating any. Removing the row (an operator's
``schedule remove``) forgets that: a worker that stores the schedule again starts it from
then, as a new one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import attrs

from ..errors import InvalidArgument, InvalidState, ScheduleExists, ScheduleNotFound
from ..model import validate
from ..model.codec import to_json
from ..model.schedule_times import tick_text
from ..model.schedules import TASK_PREFIX, Schedule
from ..model.values import WorkflowTask
from . import checks
from .dialect import Dialect, Transaction
from .schedule_records import ScheduleEvent, ScheduleRecord, TickAttempt, schedule_event, schedule_record
from .sql_operators import insert_tasks


def _definition(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "definition_name": schedule.workflow,
        "definition_version": schedule.version,
        "cron": schedule.cron,
        "every_s": schedule.every_s,
        "timezone": schedule.timezone,
        "input": to_json(schedule.input),
    }


def _described(row: Any) -> dict[str, Any]:
    """A stored definition as a changed event records it."""
    keys = ("definition_name", "definition_version", "cron", "every_s", "timezone", "input")
    return {key: row[key] for key in keys}


class ScheduleOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect

    def declare_schedules(self, schedules: Iterable[Schedule]) -> None:
        """Store each schedule's definition (a worker does when it starts, for its
        registry's schedules): a new name is stored active from now, so it creates no
        tick from before it existed; a changed definition replaces the stored one (the
        last worker to start wins; the change is in the schedule's history). Either way
        ``declared_at`` becomes now, so ``schedules`` can tell a schedule no live worker
        declares (every one started after its last declaration). In name order, so two
        workers starting at once lock rows in the same order."""
        given = list(schedules) if isinstance(schedules, Iterable) else None
        if given is None or not all(isinstance(s, Schedule) for s in given):
            validate.refuse("schedules", "an iterable of Schedule", schedules)
        found = sorted(given, key=lambda s: s.name)
        d = self.dialect
        with d.transaction() as tx:
            for schedule in found:
                params = _definition(schedule) | {"now": tx.now()}
                inserted = tx.one("insert_schedule", params) is not None
                stored = None if inserted else tx.one("lock_schedule", params)
                if not inserted and stored is None:  # removed since the insert found it
                    inserted = tx.one("insert_schedule", params) is not None
                if inserted:
                    _event(
                        tx, schedule.name, "declared", None, None, {"expression": schedule.times.describe()}
                    )
                    continue
                assert stored is not None
                tx.count("redeclare_schedule", params)
                before = _described(stored)
                after = _described(params)
                if before != after:
                    tx.count("change_schedule", params)
                    _event(tx, schedule.name, "changed", None, None, {"before": before, "after": after})

    def create_schedule(
        self, schedule: Schedule, *, actor: str | None = None, reason: str | None = None
    ) -> ScheduleRecord:
        """Store ``schedule``, created at run time beside the ones registries declare:
        active from now (no tick before it), ticked by every running worker whose
        registry has its workflow version, from that worker's next look (within
        ``schedule_ticker.CREATED_LOOK_S``), with no restart. A name already stored is
        :class:`ScheduleExists`. Its history records the creation (with ``actor`` and
        ``reason`` when given). The store knows no registry, so it cannot check the
        workflow version is served anywhere: check it first against yours, as
        ``registry.add_schedule`` does, with ``registry.tick_task(schedule, tick)``."""
        validate.instance("schedule", schedule, Schedule)
        _audit(actor, reason)
        d = self.dialect
        with d.transaction() as tx:
            params = _definition(schedule) | {"queue": schedule.queue, "now": tx.now()}
            row = tx.one("create_schedule", params)
            if row is None:
                raise ScheduleExists(schedule.name)
            free = None if reason is None else d.free_text(reason)
            _event(tx, schedule.name, "created", actor, free, {"expression": schedule.times.describe()})
            return schedule_record(row, d)

    def delete_schedule(
        self, name: str, *, actor: str | None = None, reason: str | None = None
    ) -> ScheduleRecord:
        """Delete schedule ``name``, one created at run time (:meth:`create_schedule`):
        no worker creates a tick of it from its next look; the tasks of ticks created
        already stay. Returns what was stored. A schedule a registry declares is refused
        (:class:`InvalidState`): its workers would store it again; take it out of the
        registry, or see ``remove_schedule``."""
        validate.text("schedule name", name)
        _audit(actor, reason)
        d = self.dialect
        with d.transaction() as tx:
            row = tx.one("delete_created_schedule", {"name": name})
            if row is None:
                if tx.one("select_schedule", {"name": name}) is None:
                    raise ScheduleNotFound(name)
                raise InvalidState(
                    f"schedule {name!r} is declared by a registry, not created at run time: its workers "
                    "would store it again; take it out of the registry (or use remove_schedule)"
                )
            record = schedule_record(row, d)
            free = None if reason is None else d.free_text(reason)
            _event(tx, name, "deleted", actor, free, {"expression": record.expression})
            return record

    def created_schedules(self) -> list[Schedule]:
        """The schedules created at run time, by name, as definitions (what a worker's
        schedule thread ticks beside its registry's)."""
        return [
            schedule_record(row, self.dialect).schedule() for row in self.dialect.all("created_schedules", {})
        ]

    def create_tick(self, name: str, tick: datetime, task: WorkflowTask) -> TickAttempt:
        """Create ``task``, the task of schedule ``name``'s tick at ``tick``, and record
        the tick, in one transaction; unless the schedule is paused, the tick is not after
        ``ticks_after`` (this or a later tick was created already) or not due yet (after
        store time). ``created`` says whether this call created it."""
        validate.text("schedule name", name)
        if not isinstance(tick, datetime) or tick.tzinfo is None:
            validate.refuse("tick", "a timezone-aware datetime", tick)
        (task,) = checks.tasks([task])
        expected = f"{TASK_PREFIX}{name}:{tick_text(tick)}"
        if task.task_id != expected:
            raise InvalidArgument(
                f"the tick of schedule {name!r} at {tick_text(tick)} must be task {expected!r} "
                f"(registry.tick_task makes it), got {validate.shown(task.task_id)}"
            )
        d = self.dialect
        with d.transaction() as tx:
            now = d.time(tx.now())
            row = tx.one("lock_schedule", {"name": name})
            if row is None:
                raise ScheduleNotFound(name)
            record = schedule_record(row, d)
            if record.paused or tick <= record.ticks_after or tick > now:
                return TickAttempt(False, record)
            tx.count("record_tick", {"name": name, "tick": d.db_time(tick)})
            insert_tasks(d, tx, [task])
            return TickAttempt(True, attrs.evolve(record, last_tick=tick))

    def schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""
        return [schedule_record(row, self.dialect) for row in self.dialect.all("list_schedules", {})]

    def schedule(self, name: str) -> ScheduleRecord:
        row = self.dialect.one("select_schedule", {"name": validate.text("schedule name", name)})
        if row is None:
            raise ScheduleNotFound(name)
        return schedule_record(row, self.dialect)

    def pause_schedule(self, name: str, *, actor: str, reason: str) -> ScheduleRecord:
        """Stop schedule ``name`` creating ticks, on every pool, from their next look;
        recorded with who and why. Pausing a paused schedule records the new actor and
        reason."""
        return self._operator("pause_schedule", "paused", name, actor, reason)

    def resume_schedule(self, name: str, *, actor: str, reason: str) -> ScheduleRecord:
        """Let schedule ``name`` create ticks again, from the first one after now: the
        ticks that fell while it was paused are not run."""
        return self._operator("resume_schedule", "resumed", name, actor, reason)

    def remove_schedule(self, name: str, *, actor: str, reason: str) -> ScheduleRecord:
        """Delete schedule ``name``'s stored state (its row), recorded in its history with
        who and why; returns what was stored. The tasks of ticks created already stay (and
        run, or are pruned, as any task). A worker whose registry still adds the schedule
        stores it again, active from then: a running one at its next look, any other when
        it starts."""
        checks.operator(actor, reason)
        validate.text("schedule name", name)
        d = self.dialect
        with d.transaction() as tx:
            row = tx.one("remove_schedule", {"name": name})
            if row is None:
                raise ScheduleNotFound(name)
            record = schedule_record(row, d)
            last = None if record.last_tick is None else tick_text(record.last_tick)
            detail = {"expression": record.expression, "last_tick": last}
            _event(tx, name, "removed", actor, d.free_text(reason), detail)
            return record

    def schedule_history(self, name: str) -> list[ScheduleEvent]:
        """What happened to schedule ``name``, oldest first."""
        found = self.dialect.all("schedule_events", {"name": validate.text("schedule name", name)})
        return [schedule_event(row, self.dialect) for row in found]

    def _operator(self, query: str, kind: str, name: str, actor: str, reason: str) -> ScheduleRecord:
        checks.operator(actor, reason)
        validate.text("schedule name", name)
        d = self.dialect
        with d.transaction() as tx:
            params = {"name": name, "actor": actor, "reason": d.free_text(reason), "now": tx.now()}
            row = tx.one(query, params)
            if row is None:
                raise ScheduleNotFound(name)
            _event(tx, name, kind, actor, params["reason"], {})
            return schedule_record(row, d)


def _event(
    tx: Transaction, name: str, kind: str, actor: str | None, reason: str | None, detail: dict[str, Any]
) -> None:
    params = {"name": name, "kind": kind, "actor": actor, "reason": reason, "now": tx.now()}
    tx.count("insert_schedule_event", params | {"detail": json.dumps(detail, sort_keys=True)})


def _audit(actor: str | None, reason: str | None) -> None:
    """An optional actor and reason of a run-time schedule change: names when given."""
    validate.optional(validate.name)("actor", actor)
    validate.optional(validate.name)("reason", reason)
