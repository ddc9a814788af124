"""``show``: one task whole, as an operator looks at it: its state and why it is not
running, its result or what it failed with, its checkpoint (the newest journal entries,
paged), the events it published and its history, each failure's traceback under its
event. What it prints is read by :func:`~runifold_sync.ops.task_report.task_report`, which
the dashboard's task page renders too."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click

from ..model.values import TaskOutcome
from ..ops.run_export import export_run
from ..ops.task_report import (
    failure_line,
    journal_json,
    journal_lines,
    refused_signals_line,
    related,
    task_report,
)
from ..store.checks import MAX_LIST_LIMIT
from ..store.records import TaskRecord
from .common import checked, database_option, json_option, opened_store


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


@click.command()
@click.argument("task_id")
@click.option(
    "--journal-limit",
    type=click.IntRange(min=1, max=MAX_LIST_LIMIT),
    default=50,
    show_default=True,
    help="Show the newest N entries of the main journal (newest last).",
)
@click.option(
    "--export",
    "export",
    is_flag=True,
    help="Print the run whole as JSON (input, every journal row, history) for "
    "runifold_sync.testing.replay: a production run as a regression test.",
)
@database_option
@json_option
def show(task_id: str, journal_limit: int, export: bool, database: str | None, as_json: bool) -> None:
    """Show a task's state, why it is not running, its checkpoint and its history."""
    if export:  # JSON whatever --json says: it is made to be read back
        with opened_store(database, reads_only=True) as store:
            click.echo(json.dumps(checked(export_run, store, task_id), indent=2))
        return
    with opened_store(database, reads_only=True) as store:
        report = task_report(store, task_id, journal_limit)
    record, events, published, children = report.record, report.history, report.published, report.children
    family = [] if report.parent is None else [report.parent]
    entries, run, usage, failure = report.journal_entries, report.run, report.usage, report.failure
    if as_json:
        click.echo(
            json.dumps(
                record_json(record)
                | {
                    "ambiguous_effect": record.ambiguous_effect,
                    "refused_signals": record.refused_signals,
                    "revision": record.revision,
                    "run": run,
                    "journal_entries": entries,
                    "journal": journal_json(report),
                    "usage": usage,
                    "result": record.result,
                    "failure": failure,
                    "parent_task": related(family[0]) if family else None,
                    "forked_from": next((e.detail["task"] for e in events if e.kind == "forked_from"), None),
                    "forks": [e.detail["task"] for e in events if e.kind == "forked"],
                    "children": [related(r) for r in children],
                    "attributes": dict(report.attribute_texts()),
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
        click.echo(f"failure: {failure_line(failure)}")
    click.echo(f"revision {record.revision}, fencing token {record.fencing_token}, usage {usage}")
    refused = refused_signals_line(record)
    if refused is not None:
        click.echo(refused)
    if record.parent_id is not None and not family:
        click.echo(f"parent: {record.parent_id} (no longer stored: pruned)")
    for relation, task in [("parent", r) for r in family] + [("child", r) for r in children]:
        about = related(task)
        click.echo(
            f"{relation}: {about['task_id']} {about['definition']} v{about['version']} {about['state']}"
        )
    for e in events:  # a fork and its original name each other
        if e.kind in ("forked", "forked_from"):
            relation = "fork" if e.kind == "forked" else "forked from"
            click.echo(f"{relation}: {e.detail['task']} at {e.detail['from_step']}")
    journal = journal_lines(report)
    if run is not None:
        paged = (
            f"the newest {len(journal)} shown (--journal-limit)" if len(journal) < entries else "all shown"
        )
        click.echo(f"run {run}, journal of {entries} entries, {paged}:")
    for line in journal:
        click.echo(f"  {line}")
    if report.attributes:
        click.echo("attributes: " + ", ".join(f"{k}={v}" for k, v in report.attribute_texts()))
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
