"""What the store keeps of a schedule (``runifold_schedules``) and its history
(``runifold_schedule_events``), as read back: the records ``store.schedules()``,
``store.create_tick`` and the CLI hand out, and their construction from rows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..model.codec import from_json
from ..model.schedule_times import ScheduleTimes, cron_times, interval_times
from ..model.schedules import Schedule
from .dialect import Row, Values


@attrs.frozen
class ScheduleRecord:
    """A schedule as stored: the definition the last worker to start with it declared,
    ``last_tick`` (the newest tick whose task was created, None before the first) and
    ``active_since`` (its first declaration or last resume: only ticks after it and after
    ``last_tick`` are created). ``paused_at``/``paused_by``/``paused_reason`` are set
    while an operator has it paused."""

    name: str
    workflow: str
    version: int
    cron: str | None
    every: timedelta | None
    timezone: str
    input: Any
    active_since: datetime
    last_tick: datetime | None
    paused_at: datetime | None
    paused_by: str | None
    paused_reason: str | None
    declared_at: datetime
    changed_at: datetime
    # 'declared' (a registry's, stored by its workers) or 'created' (store.create_schedule),
    # and the named queue of a created one's ticks (a declared one's is its registry's).
    origin: str = "declared"
    queue: str = "default"

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def ticks_after(self) -> datetime:
        """Ticks at or before this are not created (any more)."""
        return self.active_since if self.last_tick is None else max(self.active_since, self.last_tick)

    def times(self) -> ScheduleTimes:
        """The stored expression's tick times (what the CLI shows the next tick by)."""
        if self.cron is not None:
            return cron_times(self.cron, self.timezone, self.name)
        assert self.every is not None
        return interval_times(self.every, self.timezone, self.name)

    def schedule(self) -> Schedule:
        """The definition as a :class:`Schedule`: what a worker ticks a created one by."""
        return Schedule(
            self.name,
            self.workflow,
            self.version,
            cron=self.cron,
            every=self.every,
            timezone=self.timezone,
            input=self.input,
            queue=self.queue,
        )

    @property
    def expression(self) -> str:
        return self.times().describe()

    def next_tick(self, now: datetime) -> datetime | None:
        """The tick a running pool creates next, seen at ``now``: the latest one due if
        there is one (it is created at the pool's next look), else the first after
        ``now``; None while paused."""
        if self.paused:
            return None
        times = self.times()
        due = times.latest_due(self.ticks_after, now)
        return due if due is not None else times.next_after(max(now, self.ticks_after))


@attrs.frozen
class ScheduleEvent:
    """One entry of a schedule's history: ``declared``, ``changed`` (``detail`` has the
    expression ``before`` and ``after``), ``paused`` or ``resumed``."""

    name: str
    at: datetime
    kind: str
    actor: str | None
    reason: str | None
    detail: dict[str, Any]


@attrs.frozen
class TickAttempt:
    """What ``store.create_tick`` did: ``created`` when this call created the tick's
    task; ``schedule`` is the schedule's state after it."""

    created: bool
    schedule: ScheduleRecord


def _time(values: Values, value: Any) -> datetime | None:
    return None if value is None else values.time(value)


def schedule_record(row: Row, values: Values) -> ScheduleRecord:
    active_since = values.time(row["active_since"])
    return ScheduleRecord(
        name=row["name"],
        workflow=row["definition_name"],
        version=int(row["definition_version"]),
        cron=row["cron"],
        every=None if row["every_s"] is None else timedelta(seconds=int(row["every_s"])),
        timezone=row["timezone"],
        input=from_json(row["input"]),
        active_since=active_since,
        last_tick=_time(values, row["last_tick"]),
        paused_at=_time(values, row["paused_at"]),
        paused_by=row["paused_by"],
        paused_reason=row["paused_reason"],
        declared_at=values.time(row["declared_at"]),
        changed_at=values.time(row["changed_at"]),
        origin=row["origin"],
        queue=row["queue"],
    )


def schedule_event(row: Row, values: Values) -> ScheduleEvent:
    at, detail = values.time(row["at"]), json.loads(row["detail"])
    return ScheduleEvent(row["name"], at, row["kind"], row["actor"], row["reason"], detail)
