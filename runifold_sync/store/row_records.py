"""Result rows as the store's records, the same on every backend.

Rows carry ``input``, ``checkpoint`` and ``result`` as JSON text; the dialect's value
adapters (:class:`~runifold_sync.store.dialect.Values`) turn a stored timestamp into an
aware UTC datetime, a stored window into a timedelta, and JSON read back from the
database into the canonical text the rest of runifold_sync writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..errors import TaskNotFound
from ..model.admission import TenantAdmission, TenantBudget, TenantPolicy
from ..model.values import TaskOutcome, TaskState
from .dialect import Row, Values
from .records import (
    ClaimedTask,
    EffectResolution,
    Lease,
    QueueStats,
    Signal,
    TaskEvent,
    TaskRecord,
    VersionReference,
    WorkerRecord,
)


def found_task(values: Values, row: Row | None, task_id: str) -> TaskRecord:
    """The record of a ``select_task`` or ``list_tasks`` row; no row: TaskNotFound."""
    if row is None:
        raise TaskNotFound(task_id)
    return task_record(row, values)


def task_record(row: Row, values: Values) -> TaskRecord:
    time = values.time
    return TaskRecord(
        task_id=row["task_id"],
        definition_name=row["definition_name"],
        definition_version=row["definition_version"],
        tenant=row["tenant"],
        input_json=row["input"],
        priority=row["priority"],
        state=TaskState(row["state"]),
        outcome=None if row["outcome"] is None else TaskOutcome(row["outcome"]),
        reason=row["reason"],
        ambiguous_effect=row["ambiguous_effect"],
        ready_at=None if row["ready_at"] is None else time(row["ready_at"]),
        worker_id=row["worker_id"],
        fencing_token=row["fencing_token"],
        lease_expires=None if row["lease_expires"] is None else time(row["lease_expires"]),
        claims_since_progress=row["claims_since_progress"],
        revision=row["revision"],
        checkpoint_json=values.json_out(row["head"]),
        result_json=values.json_out(row["result"]),
        created_at=time(row["created_at"]),
        updated_at=time(row["updated_at"]),
        parent_id=row["parent_id"],
        waiting_for_child=row["waiting_for_child"],
        paused=row["paused"],
        queue=row["queue"],
        concurrency_key=row["concurrency_key"],
        dedup_key=row["dedup_key"],
        debounce_key=row["debounce_key"],
        fingerprint=row["fingerprint"],
        refused_signals=row["refused_signals"],
        detached=bool(row["detached"]),
    )


def effect_resolutions(rows: Iterable[Row], values: Values) -> dict[str, EffectResolution]:
    return {
        r["effect_key"]: EffectResolution(
            r["effect_key"], bool(r["applied"]), values.json_out(r["result"]), r["actor"], r["reason"]
        )
        for r in rows
    }


def claimed_task(
    row: Row, worker_id: str, values: Values, resolutions: dict[str, EffectResolution]
) -> ClaimedTask:
    """A leased row with the claim's timing: ``due_at``, ``at`` (the claim's store time),
    ``from_state``, and the row as it was before (``previous_updated_at``,
    ``previous_signal``)."""
    time = values.time
    return ClaimedTask(
        lease=Lease(
            row["task_id"],
            row["tenant"],
            worker_id,
            row["fencing_token"],
            time(row["lease_expires"]),
            row["cancel_requested"],
        ),
        definition_name=row["definition_name"],
        definition_version=row["definition_version"],
        input_json=row["input"],
        revision=row["revision"],
        checkpoint_json=values.json_out(row["head"]),
        claims_since_progress=row["claims_since_progress"],
        resolutions=resolutions,
        due_at=time(row["due_at"]),
        claimed_at=time(row["at"]),
        from_state=row["from_state"],
        trace_context=row["trace_context"],
        **_waited(row, values),
    )


def _waited(row: Row, values: Values) -> dict[str, Any]:
    """When and on what a task resumed from a wait had been waiting (the row as it was
    before the claim: suspension set ``updated_at`` and, for a signal, its name)."""
    if row["from_state"] != "waiting":
        return {}
    kind = "timer" if row["previous_signal"] is None else "signal"
    return {"wait_started_at": values.time(row["previous_updated_at"]), "wait_kind": kind}


def task_event(row: Row, values: Values) -> TaskEvent:
    return TaskEvent(
        row["event_id"],
        row["task_id"],
        values.time(row["at"]),
        row["kind"],
        row["worker_id"],
        row["fencing_token"],
        values.detail(row["detail"]),
    )


def signal(row: Row, values: Values) -> Signal:
    return Signal(
        row["signal_id"],
        row["name"],
        row["payload"],
        row["sender"],
        row["reason"],
        values.time(row["sent_at"]),
    )


def tenant_admission(row: Row, values: Values) -> TenantAdmission:
    window = None if row["budget_window"] is None else values.duration(row["budget_window"])
    budget = (
        None if row["budget_cost"] is None or window is None else TenantBudget(row["budget_cost"], window)
    )
    oldest = row["oldest_charge_at"]
    return TenantAdmission(
        policy=TenantPolicy(row["tenant"], row["max_leased"], budget),
        at=values.time(row["at"]),
        leased=row["leased"],
        spent=float(row["spent"]),
        ready=row["ready"],
        oldest_charge_at=None if oldest is None else values.time(oldest),
    )


def worker_record(row: Row, values: Values) -> WorkerRecord:
    """``definitions`` is read as JSON text on both backends."""
    definitions = json.loads(row["definitions"])
    time = values.time
    return WorkerRecord(
        row["worker_id"],
        row["host"],
        row["pid"],
        time(row["started_at"]),
        time(row["last_seen"]),
        None if row["stopped_at"] is None else time(row["stopped_at"]),
        [(str(name), int(version)) for name, version, *_fingerprint in definitions],
        float(row["silent_s"]),
        {(str(name), int(version)): str(rest[0]) for name, version, *rest in definitions if rest},
        ("default",) if row["queues"] is None else tuple(str(q) for q in json.loads(row["queues"])),
    )


def version_reference(row: Row) -> VersionReference:
    return VersionReference(
        row["definition_name"],
        row["definition_version"],
        int(row["queued"]),
        int(row["leased"]),
        int(row["waiting"]),
        int(row["recoverable"]),
        tuple(sorted(set(filter(None, (row["fingerprints"] or "").split(","))))),
    )


def queue_stats(row: Row) -> QueueStats:
    age = row["oldest_ready_age_s"]
    return QueueStats(
        row["tenant"],
        TaskState(row["state"]),
        None if row["outcome"] is None else TaskOutcome(row["outcome"]),
        int(row["count"]),
        None if age is None else max(float(age), 0.0),
    )
