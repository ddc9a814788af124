"""Argument checks of the store's operations, the same on every backend.

Each raises :class:`InvalidArgument` naming the argument, before anything is written, so
a bad call fails the same way on SQLite and PostgreSQL and never as a database error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model.admission import TenantPolicy
from ..model.attributes import encode_all as encode_attributes
from ..model.attributes import filter_json as attribute_filter_json
from ..model.codec import MAX_NESTING_DEPTH, NestedTooDeep, NotJsonable, from_json, to_json
from ..model.moments import check_moment
from ..model.values import (
    MAX_INPUT_BYTES,
    DeclaredSignals,
    TaskState,
    WorkflowTask,
    bounded,
    check_count,
    check_duration_bound,
    check_int,
    check_name,
    input_text,
)
from .records import Routes

MAX_CLAIM_LIMIT = 1000
MAX_LIST_LIMIT = 10_000
MAX_PENDING_SIGNALS = 100  # the default cap; stores take ``max_pending_signals``
# How long a dashboard login lasts unless told (``create_app(session_lifetime=)``,
# ``dashboard --session-lifetime``): an operator's working stretch, not a month.
DEFAULT_LOGIN_LIFETIME = timedelta(hours=4)
# An event (ctx.set_event) is a progress note or a small answer, read by callers that
# poll or wait for it: its value is held to this many bytes of JSON.
MAX_EVENT_BYTES = 64 * 1024
MAX_PRUNE_BATCH = 10_000  # tasks a prune deletes in one transaction


def check_tasks(tasks: object) -> list[WorkflowTask]:
    """A batch to enqueue: a list of WorkflowTask, each id at most once, each field
    checked as ``WorkflowTask.new`` checks it (a task built directly or changed with
    ``attrs.evolve`` is not), its input in canonical form, so both backends keep the
    same text and a worker can decode it."""
    if not isinstance(tasks, list):
        raise InvalidArgument(f"tasks must be a list of WorkflowTask, got {type(tasks).__name__}")
    seen: set[str] = set()
    checked = []
    for task in tasks:
        if not isinstance(task, WorkflowTask):
            raise InvalidArgument(f"enqueue takes WorkflowTask objects (WorkflowTask.new), got {task!r}")
        task.check()
        if task.task_id in seen:
            raise InvalidArgument(f"task id {task.task_id!r} appears twice in one enqueue batch")
        seen.add(task.task_id)
        text = _task_input(task)  # already canonical for a task WorkflowTask.new made: no copy
        checked.append(task if text == task.input_json else attrs.evolve(task, input_json=text))
    return checked


def _task_input(task: WorkflowTask) -> str:
    """``task.input_json`` as the canonical text ``WorkflowTask.new`` would have made of
    the value it holds, refused (naming the task) when it is not strict JSON."""
    text: object = task.input_json
    if not isinstance(text, str):
        raise InvalidArgument(
            f"input_json of task {task.task_id!r} must be a str of JSON, got {bounded(text)}"
        )
    try:
        value = from_json(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"input_json of task {task.task_id!r} is not JSON text: {exc}") from None
    try:
        return input_text(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"input_json of task {task.task_id!r}: {exc}") from None


def check_declarations(declarations: object) -> list[DeclaredSignals]:
    """What ``declare_signals`` takes: DeclaredSignals (``WorkflowDefinition.declared_signals``)."""
    if not isinstance(declarations, Iterable) or isinstance(declarations, (str, bytes)):
        raise InvalidArgument(f"declarations must be an iterable of DeclaredSignals, got {declarations!r}")
    found = list(declarations)
    for declared in found:
        if not isinstance(declared, DeclaredSignals):
            raise InvalidArgument(f"expected DeclaredSignals (definition.declared_signals), got {declared!r}")
    return found


def check_text(field: str, value: object) -> str:
    """A string argument that is looked up or kept as it is (a task id, a key, a name):
    anything else is refused here, on every backend alike, rather than left to the
    database (PostgreSQL would answer with an error that reads as an outage). So is a
    string no store can hold: one with a NUL (PostgreSQL text cannot, so it was refused
    there and not found on SQLite) or a lone surrogate, which UTF-8 cannot encode (both
    drivers raised a bare UnicodeEncodeError)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string, got {value!r}")
    if "\x00" in value:
        raise InvalidArgument(f"{field} must not contain a NUL character, got {bounded(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"{field} must be text UTF-8 can encode (no lone surrogates), got {bounded(value)}"
        ) from None
    return value


def check_free_text(field: str, value: object) -> str:
    """Free text (a reason, often an exception's message): a string, which the dialect's
    ``free_text`` then makes storable (a lone surrogate escaped, a NUL replaced) rather
    than refused, since refusing would lose the failure it records."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string, got {value!r}")
    return value


def check_task_id(task_id: object) -> str:
    """The task id every store method that takes one checks, the same way, before the
    database sees it: a number would read as no such task on SQLite and as an outage
    (``text = smallint``) on PostgreSQL."""
    return check_text("task id", task_id)


def check_claim_limit(limit: object) -> int:
    return check_int("claim limit", limit, minimum=1, maximum=MAX_CLAIM_LIMIT)


def check_journal_limit(limit: object) -> int:
    return check_int("journal limit", limit, minimum=1, maximum=MAX_LIST_LIMIT)


def check_operator(actor: str, reason: str) -> None:
    """Operator actions are audited: who and why are required."""
    check_name("actor", actor)
    check_name("reason", reason)


def check_resolution(applied: object, actor: str, reason: str) -> None:
    check_operator(actor, reason)
    if applied is not True and applied is not False:
        raise InvalidArgument(f"applied must be True or False, got {applied!r}")


def check_result_json(text: object) -> str | None:
    """``resolve_effect``'s ``result_json``: None, or a str of strict JSON text, which the
    task's next claim decodes as the effect's output. Refused here, on every backend
    alike: kept, text that is not JSON would fail the task for good inside the worker
    (SQLite stores any text), and another type would reach the database driver. Held
    to what a signal payload may be (no NaN or Infinity, nesting, size); returned in the
    canonical form, so both backends hand back the same text."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidArgument(f"result_json must be None or a str of JSON text, got {bounded(text)}")
    try:
        value = from_json(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"result_json {bounded(text)} is not JSON text: {exc}") from None
    # Python's decoder takes NaN and Infinity, which the canonical encoder then refuses.
    what, instead = f"result_json {bounded(text)}", "store it outside and pass its id"
    return _json_text(what, value, MAX_INPUT_BYTES, instead, not_json="is not strict JSON")


def check_wait_timeout(timeout: object) -> float:
    if not isinstance(timeout, timedelta) or timeout < timedelta(0):
        raise InvalidArgument(f"wait timeout must be a non-negative timedelta, got {timeout!r}")
    return timeout.total_seconds()


def check_timeout(kind: str, timeout: object) -> float:
    """How long a caller blocks (``wait_for_task``, ``get_event``): a timedelta from zero
    to :data:`~runifold_sync.model.values.MAX_DURATION`, in seconds."""
    if not isinstance(timeout, timedelta) or timeout < timedelta(0):
        raise InvalidArgument(f"{kind} must be a non-negative timedelta, got {timeout!r}")
    return check_duration_bound(kind, timeout).total_seconds()


def check_event(key: object, value: Any) -> str:
    """An event's key (a name, as a signal's) and value; returns the value's canonical
    JSON text. Refused, naming the key, where ``get_event`` could not hand it back: not
    JSON, nested past :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH`, or over
    :data:`MAX_EVENT_BYTES` encoded."""
    check_name("event key", key)
    return _json_text(
        f"value of event {key!r}", value, MAX_EVENT_BYTES, "publish a reference (an id, a URL) to it"
    )


def update_event_key(update_id: str) -> str:
    """The event that answers update ``update_id`` (``store.update`` waits for it): the
    workflow's reply, ``{"reply": value}``, or its rejection, ``{"rejected": reason}``."""
    return f"update:{update_id}"


def check_stream_value(key: object, value: Any) -> str:
    """A stream value's key (a name) and value, as :func:`check_event` checks an event's:
    returns the value's canonical JSON text."""
    check_name("stream key", key)
    return _json_text(
        f"value of stream {key!r}", value, MAX_EVENT_BYTES, "write a reference (an id, a URL) to it"
    )


def check_clock_offset(offset: object) -> timedelta:
    if not isinstance(offset, timedelta):
        raise InvalidArgument(f"clock offset must be a timedelta, got {offset!r}")
    return check_duration_bound("clock offset", offset)


def check_wake_at(wake_at: object) -> datetime | None:
    """A timer's due time: None (a signal wait) or a moment both backends keep and read
    back (``check_moment``), which they compare with store time exactly."""
    return None if wake_at is None else check_moment("wake_at", wake_at)


def check_delay(delay: object) -> timedelta:
    if not isinstance(delay, timedelta):
        raise InvalidArgument(f"delay must be a timedelta, got {delay!r}")
    return check_duration_bound("delay", delay)


def check_older_than(field: str, value: object) -> timedelta:
    """A retention's age (``prune``'s ``older_than``, ``run --retention``): a timedelta of
    zero (every finished task) up to the longest duration a store keeps."""
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise InvalidArgument(f"{field} must be a non-negative timedelta, got {value!r}")
    return check_duration_bound(field, value)


def check_prune_batch(field: str, value: object) -> int:
    return check_int(field, value, minimum=1, maximum=MAX_PRUNE_BATCH)


def check_pending_cap(cap: object) -> int:
    return check_count("max_pending_signals", cap)


def check_login_lifetime(lifetime: object, field: str = "login lifetime") -> timedelta:
    """How long an operator's login lasts: a timedelta longer than zero, up to the
    longest duration a store adds to its clock."""
    if not isinstance(lifetime, timedelta) or lifetime <= timedelta(0):
        raise InvalidArgument(f"{field} must be a timedelta longer than 0, got {lifetime!r}")
    return check_duration_bound(field, lifetime)


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
    past :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH`, text over :data:`MAX_INPUT_BYTES`."""
    return _json_text(
        f"payload of signal {signal_id!r}", payload, MAX_INPUT_BYTES, "store it outside and send its id"
    )


def _json_text(
    what: str, value: Any, limit_bytes: int, instead: str, not_json: str = "is not JSON-serializable"
) -> str:
    """``value``'s canonical JSON text, refused (naming ``what``) when it is not JSON
    (``not_json`` says so), nests too deeply, or is over ``limit_bytes`` encoded
    (``instead`` says what to do)."""
    try:
        text = to_json(value, max_depth=MAX_NESTING_DEPTH)
    except NestedTooDeep as exc:
        raise InvalidArgument(f"{what} {exc}") from exc
    except NotJsonable as exc:
        raise InvalidArgument(f"{what} {not_json}: {exc}") from exc
    size = len(text.encode())
    if size > limit_bytes:
        raise InvalidArgument(
            f"{what} is {size} bytes encoded, over the limit of {limit_bytes}; for large data, {instead}"
        )
    return text


def list_filters(
    state: TaskState | None,
    tenant: str | None,
    definition: str | None,
    parent: str | None,
    limit: object,
    queue: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters of query ``list_tasks``; ``attributes``: search attributes every
    listed task has (``ctx.set_attributes``), each of the same kind and value."""
    if state is not None and not isinstance(state, TaskState):
        raise InvalidArgument(f"state must be a TaskState, got {state!r}")
    # Each a name a task was given (checked by WorkflowTask.new), or None: no filter. A
    # value of another type matched nothing, or failed in the driver.
    for field, value in (
        ("tenant", tenant),
        ("definition", definition),
        ("parent", parent),
        ("queue", queue),
    ):
        if value is not None:
            check_name(f"{field} filter", value)
    check_int("list limit", limit, minimum=1, maximum=MAX_LIST_LIMIT)
    return {
        "state": None if state is None else state.value,
        "tenant": tenant,
        "definition": definition,
        "parent": parent,
        "queue": queue,
        "limit": limit,
    } | attribute_filter(attributes)


def attribute_filter(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The attribute part of ``list_filters``' parameters: none matches every task."""
    found = [] if attributes is None else encode_attributes("attributes filter", attributes)
    return {"attributes": attribute_filter_json(found), "attribute_count": len(found)}


def check_routes(routes: object) -> Routes | None:
    """None (claim anything) or a worker's :class:`Routes`."""
    if routes is not None and not isinstance(routes, Routes):
        raise InvalidArgument(f"routes must be Routes or None, got {routes!r}")
    return routes


def check_policy(policy: object) -> TenantPolicy:
    if not isinstance(policy, TenantPolicy):
        raise InvalidArgument(f"policy must be a TenantPolicy, got {policy!r}")
    return policy
