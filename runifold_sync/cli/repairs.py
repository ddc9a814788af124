"""Repairing runs from the command line: ``fork``, ``upgrade``, and the filters of
``retry`` and ``cancel`` (which ``main.py`` declares, with their one-task form)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import click

from ..engine.dry_replay import dry_replay
from ..model.checkpoint import Checkpoint
from ..model.codec import to_json
from ..model.values import TaskOutcome, TaskState
from ..ops.in_flight import upgrade as upgrade_runs
from ..store.base import WorkflowStore
from ..store.repair_records import MAX_REDRIVE_BATCH, Redrive, TaskSelector
from ..store.sql_repairs import forked_checkpoint
from .common import (
    app_option,
    audit_options,
    checked,
    database_option,
    echo_json,
    json_option,
    opened_store,
    parsed_json,
    start_time,
)


def filter_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The task filter of ``retry`` and ``cancel`` (``TaskSelector``), with ``--dry-run``
    and ``--batch``."""
    options = [
        click.option("--definition", default=None, help="Filter: tasks of this workflow."),
        click.option("--version", "def_version", type=int, default=None, help="Filter: of this version."),
        click.option(
            "--state",
            type=click.Choice([s.value for s in TaskState]),
            default=None,
            help="Filter: in this state.",
        ),
        click.option(
            "--outcome",
            type=click.Choice([o.value for o in TaskOutcome]),
            default=None,
            help="Filter: finished with this outcome (retry: failed unless given).",
        ),
        click.option("--reason-contains", default=None, help="Filter: whose reason contains this text."),
        click.option("--tenant", default=None, help="Filter: of this tenant."),
        click.option("--queue", default=None, help="Filter: on this named queue."),
        click.option(
            "--since",
            default=None,
            callback=start_time,
            help="Filter: last changed at or after this ISO 8601 time, or this long ago (2h, 1d).",
        ),
        click.option(
            "--until",
            default=None,
            callback=start_time,
            help="Filter: last changed before this ISO 8601 time, or this long ago.",
        ),
        click.option(
            "--dry-run", is_flag=True, help="With a filter: print the count and the first ids only."
        ),
        click.option(
            "--batch",
            type=click.IntRange(1, MAX_REDRIVE_BATCH),
            default=100,
            show_default=True,
            help="With a filter: tasks changed per transaction.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def selector_of(store: WorkflowStore, filters: dict[str, Any], *, retry: bool) -> TaskSelector | None:
    """The ``TaskSelector`` the filter options give, None when none is given. A delay
    (``--since 2h``) is that long before store time."""
    given = {k: v for k, v in filters.items() if v is not None}
    if not given:
        return None
    now = store.now()

    def moment(value: datetime | timedelta | None) -> datetime | None:
        return now - value if isinstance(value, timedelta) else value

    selector: TaskSelector = checked(
        TaskSelector,
        definition=filters["definition"],
        version=filters["def_version"],
        state=None if filters["state"] is None else TaskState(filters["state"]),
        outcome=TaskOutcome(filters["outcome"])
        if filters["outcome"] is not None
        else (TaskOutcome.FAILED if retry else None),
        reason_contains=filters["reason_contains"],
        tenant=filters["tenant"],
        queue=filters["queue"],
        since=moment(filters["since"]),
        until=moment(filters["until"]),
    )
    return selector


def redrive(
    action: str,
    task_ids: tuple[str, ...],
    filters: dict[str, Any],
    actor: str,
    reason: str,
    dry_run: bool,
    batch: int,
    database: str | None,
    as_json: bool,
) -> None:
    """``retry``/``cancel`` with a filter: the tasks it matches, a batch per transaction,
    progress on stderr."""
    if task_ids:
        raise click.UsageError(f"{action} takes task ids or a filter, not both")
    with opened_store(database) as store:
        selector = selector_of(store, filters, retry=action == "retry")
        assert selector is not None

        def progress(looked: int, matched: int) -> None:
            click.echo(f"{action}: {looked}/{matched} looked at", err=True)

        run = store.retry_where if action == "retry" else store.cancel_where
        done: Redrive = checked(
            run, selector, actor=actor, reason=reason, batch=batch, dry_run=dry_run, progress=progress
        )
    if as_json:
        echo_json(
            {
                "action": action,
                "dry_run": done.dry_run,
                "matched": done.matched,
                "changed": done.changed,
                "first": list(done.first),
                "skipped": done.skipped_count,
                "first_skipped": [{"task_id": t, "why": why} for t, why in done.skipped],
            }
        )
        return
    if done.dry_run:
        click.echo(
            f"{done.matched} task(s) match; first: {', '.join(done.first) or '-'} (dry run: nothing changed)"
        )
        return
    verb = "requeued" if action == "retry" else "cancelled"
    click.echo(f"{done.matched} matched, {done.changed} {verb}, {done.skipped_count} skipped")
    for task_id, why in done.skipped:
        click.echo(f"  skipped {task_id}: {why}")


@click.command()
@click.argument("task_id")
@click.option(
    "--from-step",
    required=True,
    help="The call to run from: a call id (charge#2) or a step id (its first call).",
)
@click.option("--input", "input_text", default=None, help="A new input as JSON (default: the original's).")
@click.option(
    "--task-id", "new_task_id", default=None, help="The new task's id (default: <task id>.fork-<random>)."
)
@click.option(
    "--to-version",
    type=click.IntRange(min=1),
    default=None,
    help="Run the fork as this newer version (needs --app).",
)
@app_option("Replay the copied calls against the app's code first, and refuse a fork it would not continue.")
@audit_options("forks it")
@database_option
@json_option
def fork(
    task_id: str,
    from_step: str,
    input_text: str | None,
    new_task_id: str | None,
    to_version: int | None,
    app_ref: str | None,
    actor: str,
    reason: str,
    database: str | None,
    as_json: bool,
) -> None:
    """Start a new task from TASK_ID's run as it was before --from-step: the calls before
    it are replayed (their effects are not repeated), the rest runs anew. The original is
    untouched; both histories name the other."""
    from ..app import load_registry

    if to_version is not None and app_ref is None:
        raise click.UsageError("--to-version needs --app: the registry that has that version")
    registry = None if app_ref is None else checked(load_registry, app_ref)
    new_input = None if input_text is None else parsed_json(input_text, "--input")
    with opened_store(database) as store:
        record = checked(store.get_task, task_id)
        definition = None
        if registry is not None:
            version = to_version or record.definition_version
            found = registry.get(record.definition_name, version)
            if found is None:
                checked(registry.task, record.definition_name, version, None)
            assert found is not None
            definition = found
            if record.checkpoint_json is not None:
                rows = store.read_journal(task_id)
                original = Checkpoint.decode(task_id, record.checkpoint_json, rows)
                kept = checked(forked_checkpoint, task_id, original, from_step, found.identity)
                input_json = record.input_json if new_input is None else to_json(new_input)
                divergence = dry_replay(found, task_id, input_json, kept)
                if divergence is not None:
                    click.echo(
                        f"refused: the app's {record.definition_name} v{version} would not continue the "
                        f"fork: {divergence.reason}",
                        err=True,
                    )
                    sys.exit(1)
        forked = checked(
            store.fork,
            task_id,
            from_step=from_step,
            input=new_input,
            actor=actor,
            reason=reason,
            definition=None if definition is None else definition.identity,
            new_task_id=new_task_id,
        )
    if as_json:
        echo_json({"task_id": forked, "forked_from": task_id, "from_step": from_step})
    else:
        click.echo(f"{forked}: forked from {task_id} at {from_step}")


@click.command()
@click.argument("name")
@click.option(
    "--from",
    "from_version",
    type=click.IntRange(min=1),
    required=True,
    help="The version to move tasks from.",
)
@click.option(
    "--to", "to_version", type=click.IntRange(min=1), required=True, help="The newer version to move them to."
)
@app_option("The app registering both versions.", required=True)
@click.option("--dry-run", is_flag=True, help="List what would move and what would stay; change nothing.")
@audit_options("upgrades them")
@database_option
@json_option
def upgrade(
    name: str,
    from_version: int,
    to_version: int,
    app_ref: str,
    dry_run: bool,
    actor: str,
    reason: str,
    database: str | None,
    as_json: bool,
) -> None:
    """Move the unfinished tasks of NAME at --from whose journals replay cleanly against
    --to (the check of `versions --replay`) onto --to, and list those left on --from.
    Once `versions` shows no task of --from, that version can be dropped from the app.
    Exit 1 when some are left."""
    from ..app import load_registry

    registry = checked(load_registry, app_ref)
    with opened_store(database) as store:
        report = checked(
            upgrade_runs,
            store,
            registry,
            name,
            from_version,
            to_version,
            actor=actor,
            reason=reason,
            dry_run=dry_run,
        )
    if as_json:
        echo_json(
            {
                "name": name,
                "from": from_version,
                "to": to_version,
                "dry_run": dry_run,
                "moved": list(report.moved),
                "kept": [{"task_id": t, "why": why} for t, why in report.kept],
            }
        )
    else:
        verb = "would move" if dry_run else "moved"
        click.echo(f"{name}: {verb} {len(report.moved)} task(s) from v{from_version} to v{to_version}")
        for task_id, why in report.kept:
            click.echo(f"  kept {task_id} on v{from_version}: {why}")
    if report.kept:
        sys.exit(1)
