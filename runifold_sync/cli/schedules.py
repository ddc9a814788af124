"""The schedule commands: ``schedules`` lists what the store keeps of each schedule, and
``schedule pause|resume|remove|history NAME`` act on one. Schedules themselves are
declared in code (``registry.add_schedule``) and stored by the workers that run them, so
there is no command to add one; ``remove`` deletes the stored state of one no registry
should have any more."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
import click

from ..model.schedule_times import tick_text
from ..store.base import WorkflowStore
from ..store.records import WorkerRecord
from ..store.schedule_records import ScheduleEvent, ScheduleRecord
from ..store.serving import live_workers, no_live_worker_declares
from .common import database_option, echo_json, json_option, opened_store, operator_action


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else tick_text(moment)


def schedule_json(record: ScheduleRecord, now: datetime) -> dict[str, Any]:
    """A schedule as ``--json`` shows it (``schedules`` adds ``no_live_worker_declares``)."""
    return {
        "name": record.name,
        "workflow": record.workflow,
        "version": record.version,
        "expression": record.expression,
        "cron": record.cron,
        "every_s": None if record.every is None else int(record.every.total_seconds()),
        "timezone": record.timezone,
        "input": record.input,
        "last_tick": _when(record.last_tick),
        "next_tick": _when(record.next_tick(now)),
        "paused": record.paused,
        "paused_at": None if record.paused_at is None else record.paused_at.isoformat(),
        "paused_by": record.paused_by,
        "paused_reason": record.paused_reason,
        "active_since": record.active_since.isoformat(),
        "declared_at": record.declared_at.isoformat(),
        "origin": record.origin,  # declared by a registry, or created at run time
        "queue": record.queue if record.origin == "created" else None,  # a declared one's: its registry's
    }


@click.command()
@database_option
@json_option
def schedules(database: str | None, as_json: bool) -> None:
    """List the stored schedules: definition, expression, timezone, the last tick created
    and the next one due (store time, UTC), and who paused it and why.

    A schedule is flagged "no live worker declares it" when every live worker (seen in
    the last 60 s) started after its last declaration or does not serve its workflow
    version: it is stored, but no running registry adds it, so nothing creates its ticks
    (`schedule remove` deletes it once no registry should have it). Not flagged means a
    live worker may declare it, not that one does."""
    with opened_store(database, reads_only=True) as store:
        records = store.schedules()
        live = live_workers(store)
        now = store.now()
    if as_json:
        echo_json([_listed_json(r, now, live) for r in records])
        return
    if not records:
        click.echo("no schedules stored (a worker whose registry adds one stores it when it starts)")
        return
    click.echo(
        f"{'name':<20} {'definition':<24} {'expression':<22} {'timezone':<16} {'last tick':<21} next tick"
    )
    for r in records:
        definition = f"{r.workflow} v{r.version}"
        last = _when(r.last_tick) or "-"
        upcoming = f"paused by {r.paused_by}: {r.paused_reason}" if r.paused else _upcoming(r, now)
        if no_live_worker_declares(r, live):
            upcoming += " [no live worker declares it]"
        click.echo(f"{r.name:<20} {definition:<24} {r.expression:<22} {r.timezone:<16} {last:<21} {upcoming}")


def _listed_json(record: ScheduleRecord, now: datetime, live: list[WorkerRecord]) -> dict[str, Any]:
    return schedule_json(record, now) | {"no_live_worker_declares": no_live_worker_declares(record, live)}


def _upcoming(record: ScheduleRecord, now: datetime) -> str:
    """The next tick; one already due is created at a running pool's next look."""
    tick = record.next_tick(now)
    assert tick is not None  # not paused
    return f"{tick_text(tick)} (due)" if tick <= now else tick_text(tick)


@click.group()
def schedule() -> None:
    """Pause, resume, remove or show the history of one schedule."""


@schedule.command()
@operator_action("name", "pauses it")
def pause(name: str, actor: str, reason: str, database: str | None, as_json: bool) -> None:
    """Pause schedule NAME: no pool creates its ticks until it is resumed (a tick's task
    created already runs)."""
    _change(database, as_json, lambda store: store.pause_schedule(name, actor=actor, reason=reason))


@schedule.command()
@operator_action("name", "resumes it")
def resume(name: str, actor: str, reason: str, database: str | None, as_json: bool) -> None:
    """Resume schedule NAME from its next tick; the ticks that fell while it was paused
    are not run."""
    _change(database, as_json, lambda store: store.resume_schedule(name, actor=actor, reason=reason))


@schedule.command()
@operator_action("name", "removes it")
def remove(name: str, actor: str, reason: str, database: str | None, as_json: bool) -> None:
    """Remove schedule NAME's stored state: `schedules` no longer lists it and no pool
    creates its ticks. The tasks of ticks created already are kept (they run, or are
    pruned, as any task); the removal is in `schedule history NAME`.

    A registry that still adds the schedule (registry.add_schedule) stores it again, as
    a new schedule starting from then: a pool running with it at its next tick, any
    other pool when it starts. Take it out of the registry and deploy that first."""
    with opened_store(database) as store:
        record = store.remove_schedule(name, actor=actor, reason=reason)
        now = store.now()
    if as_json:
        echo_json(schedule_json(record, now) | {"next_tick": None, "removed": True})
        return
    last = _when(record.last_tick) or "none"
    click.echo(f"schedule {record.name}: removed (last tick {last}; its ticks' tasks are kept)")


def _change(database: str | None, as_json: bool, change: Callable[[WorkflowStore], ScheduleRecord]) -> None:
    """Make an audited change to a schedule and say where it stands now."""
    with opened_store(database) as store:
        record = change(store)
        now = store.now()
    if as_json:
        echo_json(schedule_json(record, now))
    elif record.paused_by is not None:
        click.echo(f"schedule {record.name}: paused")
    else:
        click.echo(f"schedule {record.name}: resumed, next tick {_when(record.next_tick(now))}")


def _event_json(event: ScheduleEvent) -> dict[str, Any]:
    return attrs.asdict(event) | {"at": event.at.isoformat()}


@schedule.command()
@click.argument("name")
@database_option
@json_option
def history(name: str, database: str | None, as_json: bool) -> None:
    """Show what happened to schedule NAME: declared, changed (another definition was
    declared), paused, resumed and removed, with who and why. A removed schedule keeps
    its history."""
    with opened_store(database, reads_only=True) as store:
        events = store.schedule_history(name)
        if not events:
            store.schedule(name)  # an unknown name is an error, not an empty history
    if as_json:
        echo_json([_event_json(e) for e in events])
        return
    for e in events:
        who = "" if e.actor is None else f" by {e.actor}: {e.reason}"
        detail = "" if not e.detail else f" {e.detail}"
        click.echo(f"{e.at.isoformat()} {e.kind}{who}{detail}")
