"""The store's checks of a whole argument (a batch, a signal, an event, a filter), the
same on every backend; single values are checked with :mod:`runifold_sync.model.validate`.

Each raises :class:`InvalidArgument` naming the argument, before anything is written, so
a bad call fails the same way on SQLite and PostgreSQL and never as a database error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgument
from ..model import validate
from ..model.attributes import encode_all as encode_attributes
from ..model.attributes import filter_json as attribute_filter_json
from ..model.codec import from_json
from ..model.values import MAX_INPUT_BYTES, DeclaredSignals, TaskState, WorkflowTask

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


def tasks(batch: object) -> list[WorkflowTask]:
    """A batch to enqueue: a list of WorkflowTask, each id at most once. Each task's
    fields, its input's canonical text among them, were checked where it was made."""
    if not isinstance(batch, list):
        validate.refuse("tasks", "a list of WorkflowTask", batch)
    seen: set[str] = set()
    for task in batch:
        validate.instance("task", task, WorkflowTask)
        if task.task_id in seen:
            raise InvalidArgument(f"task id {task.task_id!r} appears twice in one enqueue batch")
        seen.add(task.task_id)
    return batch


def declarations(value: object) -> list[DeclaredSignals]:
    """What ``declare_signals`` takes: DeclaredSignals (``WorkflowDefinition.declared_signals``)."""
    if not isinstance(value, Iterable) or isinstance(value, (str, bytes)):
        validate.refuse("declarations", "an iterable of DeclaredSignals", value)
    return [validate.instance("declaration", d, DeclaredSignals) for d in value]


def operator(actor: object, reason: object) -> None:
    """Operator actions are audited: who and why are required."""
    validate.name("actor", actor)
    validate.name("reason", reason)


def result_json(text: object) -> str | None:
    """``resolve_effect``'s ``result_json``: None, or a str of strict JSON text, which the
    task's next claim decodes as the effect's output, held to what a signal payload may
    be and returned in canonical form, so both backends hand back the same text."""
    if text is None:
        return None
    text = validate.instance("result_json", text, str)
    try:
        value = from_json(text)
    except (ValueError, RecursionError) as exc:
        validate.refuse("result_json", f"JSON text ({exc})", text)
    # Python's decoder takes NaN and Infinity, which the canonical encoder then refuses.
    return validate.json_text(f"result_json {validate.shown(text)}", value, limit=MAX_INPUT_BYTES)


def event(key: object, value: Any) -> str:
    """An event's key (a name, as a signal's) and value; returns the value's canonical
    JSON text, refused where ``get_event`` could not hand it back."""
    validate.name("event key", key)
    return validate.json_text(
        f"value of event {key!r}",
        value,
        limit=MAX_EVENT_BYTES,
        instead="publish a reference (an id, a URL) to it",
    )


def update_event_key(update_id: str) -> str:
    """The event that answers update ``update_id`` (``store.update`` waits for it): the
    workflow's reply, ``{"reply": value}``, or its rejection, ``{"rejected": reason}``."""
    return f"update:{update_id}"


def stream_value(key: object, value: Any) -> str:
    """A stream value's key (a name) and value, as :func:`event` checks an event's:
    returns the value's canonical JSON text."""
    validate.name("stream key", key)
    return validate.json_text(
        f"value of stream {key!r}",
        value,
        limit=MAX_EVENT_BYTES,
        instead="write a reference (an id, a URL) to it",
    )


def signal(name: str, signal_id: str, sender: str, tenant: str, reason: str | None, payload: Any) -> str:
    """Check a delivery's arguments; returns the payload's canonical JSON text, the form
    that is stored and that deduplication compares."""
    validate.name("signal name", name)
    validate.name("signal id", signal_id)
    validate.name("sender", sender)
    validate.name("tenant", tenant)
    validate.optional(validate.name)("reason", reason)
    return validate.json_text(
        f"payload of signal {signal_id!r}",
        payload,
        limit=MAX_INPUT_BYTES,
        instead="store it outside and send its id",
    )


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
    validate.optional(validate.is_a(TaskState))("state", state)
    # Each a name a task was given (checked by WorkflowTask.new), or None: no filter. A
    # value of another type matched nothing, or failed in the driver.
    for field, value in (
        ("tenant", tenant),
        ("definition", definition),
        ("parent", parent),
        ("queue", queue),
    ):
        if value is not None:
            validate.name(f"{field} filter", value)
    validate.integer("list limit", limit, minimum=1, maximum=MAX_LIST_LIMIT)
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
