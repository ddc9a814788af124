"""One task whole, as an operator looks at it: the record, its history, its family, the
events it published, the newest entries of its journal, its usage and what it failed
on. ``show`` prints it and the dashboard's task page renders it; both read it here so
they answer the same question the same way."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import attrs

from ..errors import TaskNotFound
from ..model.checkpoint import Checkpoint
from ..model.effects import ReadEvidence, read_evidence
from ..model.values import TaskOutcome
from ..store.base import WorkflowStore
from ..store.checkpoints import newest_entries
from ..store.checks import MAX_LIST_LIMIT
from ..store.records import PublishedEvent, TaskEvent, TaskRecord
from ..store.refusals import RECORDED_SIGNAL_REFUSALS


@attrs.frozen
class TaskReport:
    """What :func:`task_report` read. ``journal`` holds the newest entries of the main
    journal as stored (JSON values, oldest first) out of ``journal_entries``; ``usage``
    is empty and ``run`` None for a task with no checkpoint yet; ``parent`` is None for
    a task enqueued from outside and for a child whose finished parent was pruned."""

    record: TaskRecord
    history: list[TaskEvent]
    parent: TaskRecord | None
    children: list[TaskRecord]
    published: list[PublishedEvent]
    journal_entries: int
    journal: list[Any]
    run: int | None
    usage: dict[str, Any]
    failure: dict[str, Any] | None
    # Its search attributes (ctx.set_attributes), by key.
    attributes: dict[str, Any] = attrs.Factory(dict)

    def attribute_texts(self) -> list[tuple[str, str]]:
        """Each attribute as (key, value text): text quoted, a time in ISO 8601, as
        ``list --where`` takes it back."""
        return [(key, attribute_text(value)) for key, value in sorted(self.attributes.items())]


def task_report(store: WorkflowStore, task_id: str, journal_limit: int) -> TaskReport:
    """Read ``task_id`` and what belongs to it; :class:`TaskNotFound` for an unknown
    task, :class:`CheckpointError` for a corrupt checkpoint."""
    record = store.get_task(task_id)
    events = store.history(task_id)
    entries = 0
    shown: list[Any] = []
    usage: dict[str, Any] = {}
    run = None
    if record.checkpoint_json:
        checkpoint = Checkpoint.decode_head(task_id, record.checkpoint_json)
        entries, shown = newest_entries(store, task_id, record.checkpoint_json, journal_limit)
        run = checkpoint.run
        usage = {
            "steps": checkpoint.usage.steps,
            "cost": checkpoint.usage.cost,
            "elapsed_s": round(checkpoint.usage.elapsed_s, 3),
            "claims": checkpoint.usage.claims,
        }
    return TaskReport(
        record=record,
        history=events,
        parent=_parent(store, record),
        children=store.list_tasks(parent=task_id, limit=MAX_LIST_LIMIT),
        published=store.published_events(task_id),
        journal_entries=entries,
        journal=shown,
        run=run,
        usage=usage,
        failure=failure(record, events),
        attributes=store.task_attributes(task_id),
    )


def attribute_text(value: Any) -> str:
    """An attribute's value as ``list --where`` reads it: text in double quotes, a time
    in ISO 8601, a boolean as true/false, a number as Python writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def journal_lines(report: TaskReport) -> list[str]:
    """The newest journal entries of ``report``, one line each, saying how an effect's
    result became known when it was not simply run (reconciled, resolved by an
    operator); an unreadable entry says so, not raises."""
    decisions = _decisions(report.history)
    return [_line(entry, decisions) for entry in report.journal]


def journal_json(report: TaskReport) -> list[dict[str, Any]]:
    """The newest journal entries of ``report`` as ``show --json`` gives them: each
    call's id, kind and status, and for an effect its idempotency key and ``evidence``
    (None while nothing is known of it): ``how`` its result became known (``ran``, ``reconciled``,
    ``resolved``), whether the reconcile or resolution found it ``applied`` (False: it
    was then run again), who resolved it (``by``) and why (``reason``), and the stored
    ``text``. An unreadable entry is given as ``{"unreadable": entry}``."""
    decisions = _decisions(report.history)
    found = []
    for entry in report.journal:
        try:
            call_id, kind, status = entry["call_id"], entry["kind"], entry["status"]
        except (TypeError, KeyError):
            found.append({"unreadable": entry})
            continue
        about: dict[str, Any] = {"id": call_id, "kind": kind, "status": status}
        if kind == "effect":
            read = _evidence(entry, decisions)
            about |= {"key": entry.get("key"), "evidence": None if read is None else attrs.asdict(read)}
        found.append(about)
    return found


# The (actor, reason) of each resolution in a task's history, by effect key.
_Decisions = dict[str, list[tuple[str, str]]]


def _decisions(history: list[TaskEvent]) -> _Decisions:
    found: _Decisions = {}
    for event in history:
        if event.kind == "effect_resolved":
            detail = event.detail
            decided = (str(detail.get("actor")), str(detail.get("reason")))
            found.setdefault(str(detail.get("effect_key")), []).append(decided)
    return found


def _evidence(entry: dict[str, Any], decisions: _Decisions) -> ReadEvidence | None:
    text = entry.get("evidence")
    return read_evidence(text, decisions.get(str(entry.get("key")))) if isinstance(text, str) else None


def _line(entry: Any, decisions: _Decisions) -> str:
    try:
        line = f"{entry['call_id']} ({entry['kind']}, {entry['status']})"
    except (TypeError, KeyError):
        return f"(unreadable entry: {json.dumps(entry)[:80]})"
    evidence = _evidence(entry, decisions)
    if evidence is None or evidence.how == "ran":
        return line
    verdict = "applied" if evidence.applied else "not applied"
    again = "" if evidence.applied else "; run again"
    if evidence.how == "reconciled":
        return f"{line}: reconciled as {verdict}{again}"
    if evidence.how == "resolved":
        return f"{line}: resolved as {verdict} by {evidence.by} ({evidence.reason}){again}"
    return f"{line}: {evidence.text}"


def related(record: TaskRecord) -> dict[str, Any]:
    """A parent or child task as a report lists it: which task, and where it stands."""
    state = record.state.value if record.outcome is None else f"{record.state.value}/{record.outcome.value}"
    return {
        "task_id": record.task_id,
        "definition": record.definition_name,
        "version": record.definition_version,
        "state": state,
    }


def _parent(store: WorkflowStore, record: TaskRecord) -> TaskRecord | None:
    """The task's parent: none for a task enqueued from outside, and for a child whose
    finished parent was pruned first (``store.prune`` keeps a child while its parent is
    stored, not the other way round)."""
    if record.parent_id is None:
        return None
    try:
        return store.get_task(record.parent_id)
    except TaskNotFound:
        return None


def failure(record: TaskRecord, events: list[TaskEvent]) -> dict[str, Any] | None:
    """What a failed task failed on: the detail of its newest ``failed`` event (reason,
    error class, step, effect key; its traceback stays with the event), None unless the
    task ended failed."""
    if record.outcome is not TaskOutcome.FAILED:
        return None
    failed = [e for e in events if e.kind == "failed"]
    if not failed:
        return {"reason": record.reason}
    detail = dict(failed[-1].detail)
    detail.pop("traceback", None)  # shown with its event in the history
    return detail


def failure_line(failure: dict[str, Any]) -> str:
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


def refused_signals_line(record: TaskRecord) -> str | None:
    """How many signals were refused where they were sent, and how many of them the
    history shows (the first few; the rest are only counted); None when none was."""
    count = record.refused_signals
    if not count:
        return None
    if count <= RECORDED_SIGNAL_REFUSALS:
        return f"{count:,} signals refused when sent, each in the history"
    return (
        f"{count:,} signals refused when sent: the history shows the first {RECORDED_SIGNAL_REFUSALS}, "
        "the rest are counted"
    )
