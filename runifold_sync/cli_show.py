"""``show``: one task whole, as an operator looks at it: its state and why it is not
running, its result or what it failed with, its checkpoint (the newest journal entries,
paged), the events it published and its history, each failure's traceback under its
event."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click

from .checkpoint import Checkpoint, newest_entries
from .cli_common import checked, database_option, json_option, opened_store
from .errors import TaskNotFound
from .models import TaskOutcome
from .store.base import WorkflowStore
from .store.checks import MAX_LIST_LIMIT
from .store.records import TaskEvent, TaskRecord


def record_json(record: TaskRecord) -> dict[str, Any]:
    """What ``list --json`` prints of a task; ``show --json`` adds to it."""
    return {
        "task_id": record.task_id,
        "definition": record.definition_name,
        "version": record.definition_version,
        "tenant": record.tenant,
        "queue": record.queue,
        "state": record.state.value,
        "outcome": None if record.outcome is None else record.outcome.value,
        "reason": record.reason,
        "status_note": record.status_note,
        "ready_at": None if record.ready_at is None else record.ready_at.isoformat(),
        "worker": record.worker_id,
        "fencing_token": record.fencing_token,
        "parent": record.parent_id,
    }


def _journal_line(entry: Any) -> str:
    """One journal entry as ``show`` prints it; an unreadable one says so, not raises."""
    try:
        return f"{entry['call_id']} ({entry['kind']}, {entry['status']})"
    except (TypeError, KeyError):
        return f"(unreadable entry: {json.dumps(entry)[:80]})"


@click.command()
@click.argument("task_id")
@click.option(
    "--journal-limit",
    type=click.IntRange(min=1, max=MAX_LIST_LIMIT),
    default=50,
    show_default=True,
    help="Show the newest N entries of the main journal (newest last).",
)
@database_option
@json_option
def show(task_id: str, journal_limit: int, database: str | None, as_json: bool) -> None:
    """Show a task's state, why it is not running, its checkpoint and its history."""
    entries = 0
    shown: list[Any] = []
    usage: dict[str, Any] = {}
    run = None
    with opened_store(database) as store:
        record = store.get_task(task_id)
        events = store.history(task_id)
        family = _parent(store, record)
        children = store.list_tasks(parent=task_id, limit=MAX_LIST_LIMIT)
        published = store.published_events(task_id)
        if record.checkpoint_json:
            checkpoint = checked(Checkpoint.decode_head, task_id, record.checkpoint_json)
            entries, shown = checked(newest_entries, store, task_id, record.checkpoint_json, journal_limit)
            run = checkpoint.run
            usage = {
                "steps": checkpoint.usage.steps,
                "cost": checkpoint.usage.cost,
                "elapsed_s": round(checkpoint.usage.elapsed_s, 3),
                "claims": checkpoint.usage.claims,
            }
    journal = [_journal_line(entry) for entry in shown]
    failure = _failure(record, events)
    if as_json:
        click.echo(
            json.dumps(
                record_json(record)
                | {
                    "ambiguous_effect": record.ambiguous_effect,
                    "revision": record.revision,
                    "run": run,
                    "journal_entries": entries,
                    "journal": journal,
                    "usage": usage,
                    "result": record.result,
                    "failure": failure,
                    "parent_task": _related(family[0]) if family else None,
                    "children": [_related(r) for r in children],
                    "events": [
                        {"key": p.key, "value": p.value, "set_at": p.set_at.isoformat()} for p in published
                    ],
                    "history": [
                        {
                            "at": e.at.isoformat(),
                            "kind": e.kind,
                            "worker": e.worker_id,
                            "token": e.fencing_token,
                            "detail": e.detail,
                        }
                        for e in events
                    ],
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"task {record.task_id}: {record.definition_name} v{record.definition_version} ({record.tenant})"
    )
    click.echo(f"state: {record.state.value}" + (f" ({record.outcome.value})" if record.outcome else ""))
    if record.status_note:
        click.echo(f"status: {record.status_note}")
    if record.reason:
        click.echo(f"reason: {record.reason}")
    if record.outcome is TaskOutcome.COMPLETED:
        click.echo(f"result: {record.result_json}")
    if failure is not None:
        click.echo(f"failure: {_failure_line(failure)}")
    click.echo(f"revision {record.revision}, fencing token {record.fencing_token}, usage {usage}")
    if record.parent_id is not None and not family:
        click.echo(f"parent: {record.parent_id} (no longer stored: pruned)")
    for relation, related in [("parent", r) for r in family] + [("child", r) for r in children]:
        about = _related(related)
        click.echo(
            f"{relation}: {about['task_id']} {about['definition']} v{about['version']} {about['state']}"
        )
    if run is not None:
        paged = (
            f"the newest {len(journal)} shown (--journal-limit)" if len(journal) < entries else "all shown"
        )
        click.echo(f"run {run}, journal of {entries} entries, {paged}:")
    for line in journal:
        click.echo(f"  {line}")
    if published:
        click.echo("events (ctx.set_event, by key):")
    for p in published:
        click.echo(f"  {p.key} = {p.value_json} (set {p.set_at.isoformat()})")
    click.echo("history:")
    for e in events:
        detail = dict(e.detail)
        trace = detail.pop("traceback", None)  # many lines: printed below its event, not in it
        click.echo(f"  {e.at.isoformat()} {e.kind:<16} {e.worker_id or '-':<16} {detail}")
        if isinstance(trace, str):
            click.echo(textwrap.indent(trace.rstrip("\n"), "      "))


def _parent(store: WorkflowStore, record: TaskRecord) -> list[TaskRecord]:
    """The task's parent as a list of none or one: none for a task enqueued from outside,
    and for a child whose finished parent was pruned first (``store.prune`` keeps a child
    while its parent is stored, not the other way round)."""
    if record.parent_id is None:
        return []
    try:
        return [store.get_task(record.parent_id)]
    except TaskNotFound:
        return []


def _related(record: TaskRecord) -> dict[str, Any]:
    """A parent or child task as ``show`` lists it: which task, and where it stands."""
    state = record.state.value if record.outcome is None else f"{record.state.value}/{record.outcome.value}"
    return {
        "task_id": record.task_id,
        "definition": record.definition_name,
        "version": record.definition_version,
        "state": state,
    }


def _failure(record: TaskRecord, events: list[TaskEvent]) -> dict[str, Any] | None:
    """What a failed task failed on: the detail of its newest ``failed`` event (reason,
    error class, step, effect key; its traceback stays with the event), None unless the
    task ended failed."""
    if record.outcome is not TaskOutcome.FAILED:
        return None
    failed = [e for e in events if e.kind == "failed"]
    if not failed:
        return {"reason": record.reason}
    detail = dict(failed[-1].detail)
    detail.pop("traceback", None)  # printed with its event in the history
    return detail


def _failure_line(failure: dict[str, Any]) -> str:
    """``ValueError in step reserve_stock#1; effect key ...``: what failed where, as far
    as the event says (a budget or crash-loop limit raises no exception)."""
    line = failure.get("error_class") or "no exception (a limit stopped the task, see reason)"
    if failure.get("step_id"):
        line += f" in step {failure['step_id']}"
    ambiguous = failure.get("ambiguous_effect")
    if failure.get("effect_key") and failure["effect_key"] != ambiguous:
        line += f"; effect key {failure['effect_key']}"
    if ambiguous:
        line += f"; ambiguous effect {ambiguous}: settle it with resolve"
    return line
