"""What a workflow's waits return and take: the values user code sees from ``ctx`` when
it waits for a timer, a signal, an approval or its children. They live with the authoring
API, not the engine, so that user code and tests can name them without the engine."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict

import attrs


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
