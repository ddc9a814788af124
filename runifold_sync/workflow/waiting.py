"""What a workflow's waits return and take: the values user code sees from ``ctx`` when
it waits for a timer, a signal, an approval or its children. They live with the authoring
API, not the engine, so that user code and tests can name them without the engine."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypedDict

import attrs

from ..errors import InvalidArgument
from ..model.values import check_duration_bound


@attrs.frozen
class SignalTimedOut:
    """``ctx.wait_for_signal`` returns this instead of a payload when its timeout passed."""

    name: str


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
