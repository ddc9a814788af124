"""Pure logic both store backends share: argument checks, the enqueue identity check,
history event details and row-to-record mapping.

Keeping these in one place is what makes the two backends report the same conflicts,
the same event detail keys and the same records; the backends differ only in SQL and in
how a column value becomes a ``datetime`` (the ``time`` argument below).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, NoReturn, Protocol

from ..admission import TenantAdmission, TenantBudget, TenantPolicy
from ..codec import MAX_NESTING_DEPTH, NestedTooDeep, NotJsonable, to_json
from ..errors import (
    CancelPending,
    EnqueueConflict,
    InvalidArgument,
    InvalidState,
    LeaseLostError,
    RunifoldError,
    SignalRefused,
    TaskNotFound,
)
from ..models import MAX_INPUT_BYTES, TaskOutcome, TaskState, WorkflowTask, check_count, check_name
from .base import (
    ClaimedTask,
    EffectResolution,
    EnqueueResult,
    Lease,
    QueueStats,
    TaskRecord,
    VersionReference,
    WorkerRecord,
)

# States a claim may take a task from; ``ready_at`` decides when.
CLAIMABLE_STATES = ("queued", "waiting", "leased")
MAX_CLAIM_LIMIT = 1000


class Row(Protocol):
    """A result row addressable by column name (``sqlite3.Row`` or a dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def check_tasks(tasks: object) -> list[WorkflowTask]:
    """A batch to enqueue: a list of WorkflowTask, each id at most once."""
    if not isinstance(tasks, list):
        raise InvalidArgument(f"tasks must be a list of WorkflowTask, got {type(tasks).__name__}")
    seen: set[str] = set()
    for task in tasks:
        if not isinstance(task, WorkflowTask):
            raise InvalidArgument(f"enqueue takes WorkflowTask objects (WorkflowTask.new), got {task!r}")
        if task.task_id in seen:
            raise InvalidArgument(f"task id {task.task_id!r} appears twice in one enqueue batch")
        seen.add(task.task_id)
    return tasks


def check_claim_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM_LIMIT:
        raise InvalidArgument(f"claim limit must be an integer in 1..{MAX_CLAIM_LIMIT}, got {limit!r}")
    return limit


def check_operator(actor: str, reason: str) -> None:
    """Operator actions are audited: who and why are required."""
    check_name("actor", actor)
    check_name("reason", reason)


def check_resolution(applied: object, actor: str, reason: str) -> None:
    check_operator(actor, reason)
    if applied is not True and applied is not False:
        raise InvalidArgument(f"applied must be True or False, got {applied!r}")


def check_wait_timeout(timeout: object) -> float:
    if not isinstance(timeout, timedelta) or timeout < timedelta(0):
        raise InvalidArgument(f"wait timeout must be a non-negative timedelta, got {timeout!r}")
    return timeout.total_seconds()


def already_enqueued(task: WorkflowTask, stored: Row) -> EnqueueResult:
    """The result of enqueueing ``task`` whose id is taken by the ``stored`` row: the same
    task, not created again, or :class:`EnqueueConflict`. Input is compared as canonical
    JSON text, so ``1`` and ``1.0`` differ on every backend."""
    differences = [
        label
        for label, column, given in (
            ("definition name", "definition_name", task.definition_name),
            ("definition version", "definition_version", task.definition_version),
            ("tenant", "tenant", task.tenant),
            ("input", "input", task.input_json),
        )
        if stored[column] != given
    ]
    if differences:
        raise EnqueueConflict(task.task_id, differences)
    return EnqueueResult(task.task_id, created=False)


# Transitions that would end a run's cycle without honouring a cancel request: while one
# is pending the store refuses them (query ``pending_cancel`` tells why no row changed).
REFUSED_WHILE_CANCEL_PENDING = frozenset({"complete", "suspend", "retry"})


def refused_transition(lease: Lease, operation: str, pending: Row | None) -> NoReturn:
    """Why a fenced transition changed no row: a pending cancel request (``pending``,
    from query ``pending_cancel``) when the lease still holds, otherwise a lost lease."""
    if pending is not None:
        raise CancelPending(lease.task_id, pending["cancel_requested"], operation)
    raise LeaseLostError(lease.task_id, lease.fencing_token, operation)


MAX_PENDING_SIGNALS = 100  # the default cap; stores take ``max_pending_signals``


def check_pending_cap(cap: object) -> int:
    return check_count("max_pending_signals", cap)


def check_signal(
    name: str, signal_id: str, sender: str, tenant: str, reason: str | None, payload: Any
) -> str:
    """Check a delivery's arguments; returns the payload's canonical JSON text, the form
    that is stored and that deduplication compares."""
    check_name("signal name", name)
    check_name("signal id", signal_id)
    check_name("sender", sender)
    check_name("tenant", tenant)
    if reason is not None:
        check_name("reason", reason)
    return signal_payload_text(signal_id, payload)


def signal_payload_text(signal_id: str, payload: Any) -> str:
    """Refuse what a waiting task could not decode: values that are not JSON, nesting
    past :data:`~runifold_sync.codec.MAX_NESTING_DEPTH`, text over :data:`MAX_INPUT_BYTES`."""
    try:
        text = to_json(payload, max_depth=MAX_NESTING_DEPTH)
    except NestedTooDeep as exc:
        raise InvalidArgument(f"payload of signal {signal_id!r} {exc}") from exc
    except NotJsonable as exc:
        raise InvalidArgument(f"payload of signal {signal_id!r} is not JSON-serializable: {exc}") from exc
    size = len(text.encode())
    if size > MAX_INPUT_BYTES:
        raise InvalidArgument(
            f"payload of signal {signal_id!r} is {size} bytes encoded, over the limit of "
            f"{MAX_INPUT_BYTES}; store large data outside and send its id"
        )
    return text


def same_signal(stored: Row, name: str, payload_text: str) -> bool:
    """Whether a stored delivery has this name and payload. The stored text is encoded
    again, so text kept before payloads were canonical compares by value too."""
    if stored["name"] != name:
        return False
    return bool(stored["payload"] == payload_text or to_json(json.loads(stored["payload"])) == payload_text)


def tenant_refusal(task: Row, tenant: str) -> str | None:
    """Checked before anything else about a delivery, so a sender of another tenant
    learns nothing about the task's signals (not even whether a signal id is taken). The
    text is for the task's history, which operators read; the sender gets
    :func:`refused_signal`'s answer."""
    if task["tenant"] != tenant:
        return f"sender's tenant {tenant!r} is not the task's tenant {task['tenant']!r}"
    return None


def refused_signal(task_id: str, signal_id: str, refusal: str, *, foreign: bool) -> RunifoldError:
    """What a refused delivery raises, after its refusal is recorded. A sender of another
    tenant (``foreign``) gets exactly the answer for a task that does not exist, so it
    cannot even learn that the task exists; everyone else is told why."""
    return TaskNotFound(task_id) if foreign else SignalRefused(task_id, signal_id, refusal)


def signal_refusal(task: Row, pending: int, cap: int) -> str | None:
    """Why a task may not take a new signal, or None. Checked before a delivery is kept."""
    if task["state"] in ("terminal", "cancelled"):
        return f"the task is {task['state']}"
    if task["cancel_requested"] is not None:  # no wait of it will run again to take it
        return "the task is being cancelled"
    if pending >= cap:
        return f"the task already has {pending} pending signals (limit {cap})"
    return None


def signal_detail(
    signal_id: str, name: str, sender: str, reason: str | None, refused: str | None = None
) -> dict[str, Any]:
    detail: dict[str, Any] = {"signal_id": signal_id, "name": name, "sender": sender, "reason": reason}
    if refused is not None:
        detail["refused"] = refused
    return detail


def not_cancellable(record: TaskRecord) -> InvalidState:
    return InvalidState(
        f"task {record.task_id!r} is {record.state.value}; only an unfinished task can be cancelled"
    )


def check_list_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidArgument(f"list limit must be an integer in 1..10000, got {limit!r}")
    return limit


def list_filters(
    state: TaskState | None, tenant: str | None, definition: str | None, limit: int
) -> dict[str, Any]:
    if state is not None and not isinstance(state, TaskState):
        raise InvalidArgument(f"state must be a TaskState, got {state!r}")
    return {
        "state": None if state is None else state.value,
        "tenant": tenant,
        "definition": definition,
        "limit": check_list_limit(limit),
    }


def not_requeueable(record: TaskRecord) -> InvalidState:
    what = record.state.value if record.outcome is None else f"{record.state.value} ({record.outcome.value})"
    hint = "; resolve its ambiguous effect instead" if record.ambiguous_effect else ""
    return InvalidState(f"task {record.task_id!r} is {what}; only a failed task can be requeued{hint}")


def requeued_detail(actor: str, reason: str) -> dict[str, Any]:
    return {"actor": actor, "reason": reason}


def worker_params(worker_id: str, host: str, pid: int, definitions: list[tuple[str, int]]) -> dict[str, Any]:
    return {"worker_id": worker_id, "host": host, "pid": pid, "definitions": json.dumps(definitions)}


def worker_record(row: Row, time: Callable[[Any], datetime]) -> WorkerRecord:
    """``definitions`` is read as JSON text on both backends."""
    definitions = json.loads(row["definitions"])
    return WorkerRecord(
        row["worker_id"],
        row["host"],
        row["pid"],
        time(row["started_at"]),
        time(row["last_seen"]),
        None if row["stopped_at"] is None else time(row["stopped_at"]),
        [(str(name), int(version)) for name, version in definitions],
        float(row["silent_s"]),
    )


def version_reference(row: Row) -> VersionReference:
    return VersionReference(
        row["definition_name"],
        row["definition_version"],
        int(row["queued"]),
        int(row["leased"]),
        int(row["waiting"]),
        int(row["recoverable"]),
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


def not_resolvable(record: TaskRecord, effect_key: str) -> InvalidState:
    return InvalidState(
        f"task {record.task_id!r} is {record.state.value} "
        f"(ambiguous effect: {record.ambiguous_effect!r}); only a task failed on "
        f"ambiguous effect {effect_key!r} can have it resolved"
    )


# --- history event details (the same keys on every backend) ----------------------------


def enqueued_detail(task: WorkflowTask) -> dict[str, Any]:
    return {"definition": task.definition_name, "version": task.definition_version}


def claimed_detail(from_state: str, previous_worker: str | None) -> dict[str, Any]:
    detail: dict[str, Any] = {"from_state": from_state}
    if from_state == "leased":
        detail["expired_owner"] = previous_worker
    return detail


def retried_detail(reason: str, delay: timedelta) -> dict[str, Any]:
    return {"reason": reason, "delay_s": delay.total_seconds()}


def failed_detail(reason: str, ambiguous_effect: str | None) -> dict[str, Any]:
    detail: dict[str, Any] = {"reason": reason}
    if ambiguous_effect is not None:
        detail["ambiguous_effect"] = ambiguous_effect
    return detail


def resolved_detail(effect_key: str, applied: bool, actor: str, reason: str) -> dict[str, Any]:
    return {"effect_key": effect_key, "applied": applied, "actor": actor, "reason": reason}


# --- rows to records ---------------------------------------------------------------------
# Rows carry ``input``, ``checkpoint`` and ``result`` as JSON text; ``time`` turns a
# stored timestamp into an aware UTC datetime.


def task_record(row: Row, time: Callable[[Any], datetime]) -> TaskRecord:
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
        checkpoint_json=row["checkpoint"],
        result_json=row["result"],
        created_at=time(row["created_at"]),
        updated_at=time(row["updated_at"]),
    )


def effect_resolutions(rows: Iterable[Row]) -> dict[str, EffectResolution]:
    return {
        r["effect_key"]: EffectResolution(
            r["effect_key"], bool(r["applied"]), r["result"], r["actor"], r["reason"]
        )
        for r in rows
    }


def claimed_task(
    row: Row,
    worker_id: str,
    time: Callable[[Any], datetime],
    resolutions: dict[str, EffectResolution],
) -> ClaimedTask:
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
        checkpoint_json=row["checkpoint"],
        claims_since_progress=row["claims_since_progress"],
        resolutions=resolutions,
        due_at=time(row["due_at"]),
        claimed_at=time(row["at"]),
        from_state=row["from_state"],
        **waited(row, time),
    )


def waited(row: Row, time: Callable[[Any], datetime]) -> dict[str, Any]:
    """When and on what a task resumed from a wait had been waiting (the row as it was
    before the claim: suspension set ``updated_at`` and, for a signal, its name)."""
    if row["from_state"] != "waiting":
        return {}
    kind = "timer" if row["previous_signal"] is None else "signal"
    return {"wait_started_at": time(row["previous_updated_at"]), "wait_kind": kind}


def tenant_admission(row: Row, time: Callable[[Any], datetime], window: timedelta | None) -> TenantAdmission:
    """A ``tenant_admission`` row; ``window`` is the budget window in the store's form."""
    budget = (
        None if row["budget_cost"] is None or window is None else TenantBudget(row["budget_cost"], window)
    )
    oldest = row["oldest_charge_at"]
    return TenantAdmission(
        policy=TenantPolicy(row["tenant"], row["max_leased"], budget),
        at=time(row["at"]),
        leased=row["leased"],
        spent=float(row["spent"]),
        ready=row["ready"],
        oldest_charge_at=None if oldest is None else time(oldest),
    )


def check_policy(policy: object) -> TenantPolicy:
    if not isinstance(policy, TenantPolicy):
        raise InvalidArgument(f"policy must be a TenantPolicy, got {policy!r}")
    return policy
