"""``python -m runifold_sync``: a thin click layer over the library.

Each command parses its options, calls the library and prints. This module holds the
entry point and the commands about single tasks; ``cli_show`` holds ``show``, ``cli_wait``
``wait``, ``cli_run`` ``run`` and ``demo``, ``cli_fleet`` the store-wide ones (schema,
versions, workers, stats, tenants), ``cli_schedules`` the schedules, ``cli_retention``
``prune``, ``cli_dashboard`` ``dashboard``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, BinaryIO

import click

from ..app import load_registry
from ..errors import InvalidArgument
from ..model.attributes import AttributeValue, parse_where
from ..model.values import MAX_INPUT_BYTES, TaskState, WorkflowTask
from ..store.records import SignalCheck
from .common import (
    BadValue,
    JsonErrorsGroup,
    app_option,
    audit_options,
    canonical_json,
    checked,
    database_option,
    echo_json,
    json_option,
    opened_store,
    operator_action,
    parsed_json,
    start_time,
)
from .dashboard import dashboard
from .fleet import migrate, stats, tenant, versions, workers
from .flow import flow
from .repairs import filter_options, fork, redrive, upgrade
from .retention import prune
from .run import demo, run
from .schedules import schedule, schedules
from .show import record_json, show
from .wait import wait


@click.group(cls=JsonErrorsGroup)
def main() -> None:
    """Durable workflows for synchronous Python."""


@main.command()
@click.argument("name")
@click.argument("version", type=int)
@click.option(
    "--input",
    "input_json",
    default="null",
    show_default=True,
    help="Workflow input as JSON; @FILE reads it from a file, - from standard input.",
)
@click.option("--tenant", default="default", show_default=True, help="Tenant the task belongs to.")
@click.option("--checkpoint-id", default=None, help="Task identity; enqueue is idempotent on it.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher is claimed first.")
@click.option(
    "--queue",
    default="default",
    show_default=True,
    help="The named queue: only workers run with --queue NAME claim it.",
)
@click.option(
    "--not-before",
    default=None,
    metavar="TIME|DELAY",
    callback=start_time,
    help="Not claimed before this: an ISO 8601 time with its offset (2026-12-24T09:00:00Z) or a "
    "delay from now in store time (30s, 5m, 1h30m, 2d).  [default: at once]",
)
@app_option(
    "The application's WorkflowRegistry: refuse a NAME or VERSION it lacks and input that "
    "does not fit the main function's type, before anything is stored."
)
@database_option
@json_option
def enqueue(
    name: str,
    version: int,
    input_json: str,
    tenant: str,
    checkpoint_id: str | None,
    priority: int,
    queue: str,
    not_before: datetime | timedelta | None,
    app_ref: str | None,
    database: str | None,
    as_json: bool,
) -> None:
    """Enqueue a task for definition NAME at VERSION. With --app the task is checked
    against the application's registry first; without it, nothing is checked."""
    value = parsed_json(_input_text(input_json), "--input")
    options = {
        "tenant": tenant,
        "checkpoint_id": checkpoint_id,
        "priority": priority,
        "not_before": not_before if isinstance(not_before, datetime) else None,
        "queue": queue,
    }
    if app_ref is None:
        task = checked(WorkflowTask.new, name, version, value, **options)
    else:
        registry = checked(load_registry, app_ref)
        task = checked(registry.task, name, version, value, **options)
    with opened_store(database) as store:
        if isinstance(not_before, timedelta):  # a delay counts from store time, not this host's clock
            task = task.evolve(not_before=store.now() + not_before)
        result = store.enqueue(task)
    if app_ref is None:  # said once the task is stored, so an error is not preceded by it
        click.echo(
            f"warning: {name!r} version {version} and its input were not checked (no --app): "
            "a name or version no worker serves waits unclaimed until one does (stats names it), "
            "and input that does not fit fails the task when it runs",
            err=True,
        )
    # An existing task keeps the start it was enqueued with: only a new one has this one.
    start = None if task.not_before is None or not result.created else task.not_before.isoformat()
    if as_json:
        echo_json({"task_id": result.task_id, "created": result.created, "not_before": start}, indent=None)
    else:
        scheduled = "" if start is None else f", not before {start}"
        click.echo(f"{result.task_id} ({'enqueued' if result.created else 'already enqueued'}{scheduled})")


def _input_text(given: str) -> str:
    """``--input`` as JSON text: as given, or read from ``@FILE`` or ``-`` (stdin), so an
    input too long for a command line can be enqueued. At most one byte past the input
    limit is read (``@/dev/zero`` must not fill memory), and the bytes must be UTF-8."""
    if given == "-":
        return _limited_text(sys.stdin.buffer, "standard input")
    if given.startswith("@"):
        path = given[1:]
        try:
            with open(path, "rb") as source:
                return _limited_text(source, repr(path))
        except OSError as exc:
            raise BadValue(f"--input: cannot read {path!r}: {exc.strerror}") from exc
    return given


def _limited_text(source: BinaryIO, what: str) -> str:
    data = source.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise BadValue(
            f"--input: {what} holds more than {MAX_INPUT_BYTES} bytes, the limit of a task's input; "
            "store large data outside and pass its id"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(f"--input: {what} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None


@main.command("list")
@click.option(
    "--state", type=click.Choice([s.value for s in TaskState]), default=None, help="Only this state."
)
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--definition", default=None, help="Only this workflow name.")
@click.option("--parent", default=None, metavar="TASK", help="Only the child tasks of this task.")
@click.option("--queue", default=None, metavar="NAME", help="Only the tasks of this named queue.")
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only tasks with this search attribute (ctx.set_attributes); repeat for several. "
    "true/false is a boolean, 120 an integer, 1.5 a number, an ISO time with offset a time, "
    'anything else text ("120" in double quotes: the text 120).',
)
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=100, show_default=True, help="At most this many."
)
@database_option
@json_option
def list_(
    state: str | None,
    tenant: str | None,
    definition: str | None,
    parent: str | None,
    queue: str | None,
    where: tuple[str, ...],
    limit: int,
    database: str | None,
    as_json: bool,
) -> None:
    """List tasks, oldest first, with why each unfinished one is not running."""
    attributes = where_conditions(where)
    with opened_store(database, reads_only=True) as store:
        records = store.list_tasks(
            state=None if state is None else TaskState(state),
            tenant=tenant,
            definition=definition,
            parent=parent,
            limit=limit,
            queue=queue,
            attributes=attributes or None,
        )
    if as_json:
        click.echo(json.dumps([record_json(r) for r in records], indent=2))
        return
    if not records:  # said, so an empty answer is not mistaken for a command that failed quietly
        given = (state, tenant, definition, parent, queue)
        filtered = bool(where) or any(value is not None for value in given)
        click.echo("no tasks match these filters" if filtered else "no tasks")
        return
    rows = [("task", "definition", "tenant", "state", "why not running / last reason")]
    for r in records:
        status = r.state.value if r.outcome is None else f"{r.state.value}/{r.outcome.value}"
        name = f"{r.definition_name} v{r.definition_version}"
        why = "; before that: ".join(text for text in (r.status_note, r.reason) if text)
        rows.append((r.task_id, name, r.tenant, status, why))
    for line in _columns(rows):
        click.echo(line)


def where_conditions(where: Sequence[str]) -> dict[str, AttributeValue]:
    """``--where KEY=VALUE`` options as an attribute filter; a malformed one, or a key
    given twice, is a usage error naming it."""
    found: dict[str, AttributeValue] = {}
    for condition in where:
        try:
            key, value = parse_where(condition)
        except InvalidArgument as exc:
            raise BadValue(f"--where: {exc}") from None
        if key in found:
            raise BadValue(f"--where: attribute {key!r} is given twice")
        found[key] = value
    return found


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (the header first) as lines of aligned columns, each as wide as its widest
    value, so a long task id or name widens its column instead of pushing the rest of
    its row out of line; the last column is left as it is."""
    widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]) - 1)]
    lines = []
    for *aligned, last in rows:
        cells = [value.ljust(width) for value, width in zip(aligned, widths, strict=True)]
        lines.append(" ".join([*cells, last]).rstrip())
    return lines


@main.command()
@click.argument("task_id")
@click.argument("name")
@click.option("--payload", "payload_json", default="null", show_default=True, help="Signal payload as JSON.")
@click.option(
    "--signal-id",
    default=None,
    help="Deduplication id: resending it delivers nothing new.  [default: derived from the task, "
    "NAME and payload (printed), so the same signal sent twice is delivered once; give ids of "
    "your own to deliver one payload more than once]",
)
@click.option(
    "--sender",
    default=None,
    help="Who sends it (checked by the workflow, kept in the history).  [default: the OS user "
    "running the command]",
)
@click.option(
    "--tenant",
    default="default",
    show_default=True,
    help="The sender's tenant; a task of another tenant answers as if it did not exist.",
)
@click.option("--reason", default=None, help="Why (kept in the history).")
@database_option
@json_option
def signal(
    task_id: str,
    name: str,
    payload_json: str,
    signal_id: str | None,
    sender: str | None,
    tenant: str,
    reason: str | None,
    database: str | None,
    as_json: bool,
) -> None:
    """Send signal NAME to a task (an approval is {"approved": true, "reason": "..."}).
    Exits 1 when it is refused: a name the task's definition does not declare, a sender
    who is not an approver of the approval it waits for, a payload that is no decision."""
    payload_text = canonical_json(payload_json, "--payload")
    payload = json.loads(payload_text)  # a value, checked strict
    said = ""  # what was not given, and is printed
    if signal_id is None:
        signal_id = derived_signal_id(task_id, name, payload_text)
        said += " (derived from the task, name and payload)"
    if sender is None:
        sender = _os_user()
        said += f" from {sender} (the OS user)"
    with opened_store(database) as store:
        delivery = store.send_signal(
            task_id, name, payload, signal_id=signal_id, sender=sender, tenant=tenant, reason=reason
        )
    checked_value = None if delivery.checked is None else delivery.checked.value
    if as_json:
        echo_json(
            {
                "task_id": task_id,
                "signal_id": signal_id,
                "sender": sender,
                "delivered": delivery.created,
                "checked": checked_value,
            }
        )
    else:
        click.echo(f"{task_id}: signal {signal_id}{said} {_delivered(delivery.checked, name)}")


def derived_signal_id(task_id: str, name: str, payload_text: str) -> str:
    """The signal id ``signal`` uses when given none: a digest of the task, the signal's
    name and its canonical payload, so sending the same signal again (a retried command)
    is delivered once, as a given id would be, and another payload is another signal."""
    digest = hashlib.sha256(json.dumps([task_id, name, payload_text]).encode()).hexdigest()
    return f"sig-{digest[:20]}"


def _os_user() -> str:
    """The name of the OS user this process runs as: the sender of a ``signal`` given no
    ``--sender``, as the system's user database names it (not ``$USER``, which anyone sets)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        raise click.UsageError(
            f"no --sender, and this process's user (uid {os.geteuid()}) has no name: give --sender"
        ) from None


def _delivered(check: SignalCheck | None, name: str) -> str:
    """What ``signal`` says of a delivery: "delivered" only for what the store checked."""
    if check is None:
        return "already delivered"
    if check is SignalCheck.WAITING:
        return "delivered"
    if check is SignalCheck.DECLARED:
        return f"delivered; kept until the task waits for {name!r}, which checks the sender and payload"
    return (
        "accepted, not yet validated: no registry has told the store this task's signals yet "
        "(enqueue with --app, or start a worker that serves it); its next wait decides, and "
        "`show` records a refusal"
    )


@main.command()
@click.argument("task_ids", nargs=-1)
@filter_options
@audit_options("cancels it")
@database_option
@json_option
def cancel(
    task_ids: tuple[str, ...],
    actor: str,
    reason: str,
    dry_run: bool,
    batch: int,
    database: str | None,
    as_json: bool,
    **filters: Any,
) -> None:
    """Cancel a task: at once if queued or waiting, at its next step boundary if running.
    Completed external writes are not undone, except by the workflow's compensations.
    With filter options instead of TASK_IDS: every unfinished task they match, a batch
    per transaction (--dry-run first: the count and the first ids)."""
    if any(v is not None for v in filters.values()):
        redrive("cancel", task_ids, filters, actor, reason, dry_run, batch, database, as_json)
        return
    if len(task_ids) != 1:
        raise click.UsageError("cancel takes one TASK_ID, or filter options (--definition, --state...)")
    [task_id] = task_ids
    with opened_store(database) as store:
        state = store.cancel(task_id, actor, reason)
    if as_json:
        echo_json({"task_id": task_id, "state": state.value, "cancelled": state is TaskState.CANCELLED})
    elif state is TaskState.CANCELLED:
        click.echo(f"{task_id}: cancelled")
    elif state is TaskState.QUEUED:
        click.echo(f"{task_id}: cancelling; a worker runs its compensations, then it ends cancelled")
    else:
        click.echo(f"{task_id}: running; its worker stops at the next step boundary")


@main.command()
@operator_action("task_id", "pauses it")
def pause(task_id: str, actor: str, reason: str, database: str | None, as_json: bool) -> None:
    """Pause a task: not claimed until resumed. A running task parks at its next step
    boundary; timers, signals and children that come meanwhile are kept for it."""
    with opened_store(database) as store:
        state = store.pause(task_id, actor=actor, reason=reason)
    if as_json:
        echo_json({"task_id": task_id, "state": state.value, "paused": True})
    elif state is TaskState.LEASED:
        click.echo(f"{task_id}: pausing; its worker parks it at the next step boundary")
    else:
        click.echo(f"{task_id}: paused ({state.value})")


@main.command()
@operator_action("task_id", "resumes it")
def resume(task_id: str, actor: str, reason: str, database: str | None, as_json: bool) -> None:
    """Resume a paused task: due at once, or (if it had not parked yet) running on. A
    cancelled task is queued again from its checkpoint, unless its cancellation ran
    compensations."""
    with opened_store(database) as store:
        if store.get_task(task_id).state is TaskState.CANCELLED:
            state = store.resume_cancelled(task_id, actor=actor, reason=reason)
        else:
            state = store.resume(task_id, actor=actor, reason=reason)
    if as_json:
        echo_json({"task_id": task_id, "state": state.value, "paused": False})
    else:
        click.echo(f"{task_id}: resumed ({state.value})")


@main.command()
@click.argument("task_ids", nargs=-1)
@filter_options
@audit_options("requeues it")
@database_option
@json_option
def retry(
    task_ids: tuple[str, ...],
    actor: str,
    reason: str,
    dry_run: bool,
    batch: int,
    database: str | None,
    as_json: bool,
    **filters: Any,
) -> None:
    """Requeue a failed task; its completed steps are kept and not run again. With
    filter options instead of TASK_IDS: every failed task they match (redrive a batch
    after a fix), a batch per transaction, each audited (--dry-run first: the count and
    the first ids)."""
    if any(v is not None for v in filters.values()):
        redrive("retry", task_ids, filters, actor, reason, dry_run, batch, database, as_json)
        return
    if len(task_ids) != 1:
        raise click.UsageError("retry takes one TASK_ID, or filter options (--definition, --outcome...)")
    [task_id] = task_ids
    with opened_store(database) as store:
        store.requeue(task_id, actor=actor, reason=reason)
        state = store.get_task(task_id).state
    if as_json:
        echo_json({"task_id": task_id, "state": state.value})
    else:
        click.echo(f"{task_id}: requeued")


@main.command()
@click.argument("task_id")
@click.argument("effect_key")
@click.option("--applied/--not-applied", required=True, help="Whether the effect happened.")
@click.option("--result", "result_json", default=None, help="The effect's result as JSON (with --applied).")
@audit_options("decided")
@database_option
@json_option
def resolve(
    task_id: str,
    effect_key: str,
    applied: bool,
    result_json: str | None,
    actor: str,
    reason: str,
    database: str | None,
    as_json: bool,
) -> None:
    """Resolve the ambiguous effect a task failed on, and requeue the task."""
    if result_json is not None:
        result_json = canonical_json(result_json, "--result")
    with opened_store(database) as store:
        store.resolve_effect(
            task_id, effect_key, applied=applied, result_json=result_json, actor=actor, reason=reason
        )
        state = store.get_task(task_id).state
    if as_json:
        echo_json({"task_id": task_id, "effect_key": effect_key, "applied": applied, "state": state.value})
        return
    click.echo(
        f"{task_id}: effect {effect_key} resolved as {'applied' if applied else 'not applied'}; requeued"
    )


for _command in (
    show,
    wait,
    run,
    demo,
    migrate,
    versions,
    workers,
    stats,
    tenant,
    flow,
    schedules,
    schedule,
    prune,
    dashboard,
    fork,
    upgrade,
):
    main.add_command(_command)
