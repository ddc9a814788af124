"""What a workflow's waits return and take: the values user code sees from ``ctx`` when
it waits for a timer, a signal, an approval or its children. They live with the authoring
API, not the engine, so that user code and tests can name them without the engine."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict

import attrs

from ..errors import InvalidArgument
from ..model.moments import check_moment
from ..model.values import check_duration_bound


@attrs.frozen
class SignalTimedOut:
    """``ctx.wait_for_signal`` returns this instead of a payload when its timeout passed."""

    name: str


@attrs.frozen
class SignalReceived:
    """What ``ctx.wait_for_signal`` returns when it waited for several names: which one
    came first (``name``) and its payload."""

    name: str
    payload: Any


@attrs.frozen
class Update:
    """An update ``ctx.wait_for_update`` accepted: its id (the caller's ``store.update``
    waits for the reply to it, ``ctx.reply(update, value)``), name, sender and payload,
    structured as the wait's ``payload_type``."""

    update_id: str
    name: str
    sender: str
    payload: Any


@attrs.frozen
class ApprovalDecision:
    """Who decided an approval, what, and why; ``approved`` False is a rejection."""

    name: str
    approver: str
    approved: bool
    reason: str | None
    escalated: bool = False


@attrs.frozen
class ApprovalTimedOut:
    """Nobody entitled decided in time (after escalation, if there was one)."""

    name: str
    escalated: bool


@attrs.frozen
class Fired:
    """What ``ctx.wait_any`` returns: which of the things it waited for came first.

    ``index`` is its position in the list given and ``item`` the item itself; ``value``
    is a child's result (structured as ``result_type``, or the :class:`ChildFailed` it
    ended with, returned rather than raised), a signal's payload (``payload_type``), or
    None for a timer. ``name`` is the signal's name, None for the others."""

    index: int
    item: Any
    value: Any
    name: str | None = None


class ChildStart(TypedDict, total=False):
    """``start_child``'s options, which ``run_child`` passes on."""

    checkpoint_id: str | None
    tenant: str | None
    queue: str
    detached: bool


@attrs.frozen
class ChildHandle:
    """A child task started by ``ctx.start_child``: pass it to ``ctx.wait_child``."""

    task_id: str
    name: str
    version: int


# What ctx.wait_any takes: a child, a signal name, a timer (a duration from the wait's
# start, or a moment).
WaitItem = ChildHandle | str | timedelta | datetime


@attrs.frozen
class ChildTimedOut:
    """``ctx.wait_child`` (or ``wait_children``) returns this instead of results when its
    timeout passed; ``task_ids`` are the children that had not ended. They keep running."""

    task_ids: tuple[str, ...]


def check_wait_timeout(what: str, timeout: object) -> timedelta | None:
    """A wait's timeout: None, or a positive timedelta no longer than ``ctx.sleep`` takes
    (the deadline is store now plus it; ``timedelta.max`` overflowed a datetime)."""
    if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
        raise InvalidArgument(f"{what} timeout must be a positive timedelta or None, got {timeout!r}")
    if timeout is None:
        return None
    return check_duration_bound(f"{what} timeout", timeout)


def check_signal_names(names: object) -> tuple[str, ...]:
    """The names a signal wait takes: one name, or a non-empty list of distinct names
    (the wait ends at the first of them)."""
    if isinstance(names, str):
        return (names,)
    if not isinstance(names, (list, tuple)) or not names:
        raise InvalidArgument(f"signal wait name must be a name or a non-empty list of names, got {names!r}")
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgument(f"signal wait names must be strings, got {name!r} in {names!r}")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"signal wait names must be distinct, got {names!r}")
    return tuple(names)


def check_wait_until(what: str, timeout: object, until: object) -> datetime | None:
    """A wait's ``until``: None, or a moment a store can hold; never with ``timeout`` too
    (one deadline per wait)."""
    if until is None:
        return None
    if timeout is not None:
        raise InvalidArgument(f"{what} takes timeout or until, not both (got {timeout!r} and {until!r})")
    return check_moment(f"{what} until", until)


def check_wait_items(items: object) -> tuple[WaitItem, ...]:
    """``ctx.wait_any``'s list: non-empty, each a ChildHandle, a signal name, a positive
    timedelta or a moment, no child or name twice."""
    if isinstance(items, (str, ChildHandle)) or not isinstance(items, (list, tuple)) or not items:
        raise InvalidArgument(
            "wait_any needs a non-empty list of child handles, signal names and timers "
            f"(timedelta or datetime), got {items!r}"
        )
    seen: set[object] = set()
    for item in items:
        if isinstance(item, ChildHandle):
            key: object = ("child", item.task_id)
        elif isinstance(item, str):
            key = ("signal", item)
        elif isinstance(item, timedelta):
            check_wait_timeout("wait_any timer", item)
            continue
        elif isinstance(item, datetime):
            check_moment("wait_any timer", item)
            continue
        else:
            raise InvalidArgument(
                f"wait_any items must be child handles, signal names, timedelta or datetime, got {item!r}"
            )
        if key in seen:
            raise InvalidArgument(f"wait_any lists {item!r} twice")
        seen.add(key)
    return tuple(items)
