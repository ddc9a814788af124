"""What a workflow's waits return and take: the values user code sees from ``ctx`` when
it waits for a timer, a signal, an approval or its children. They live with the authoring
API, not the engine, so that user code and tests can name them without the engine."""

from __future__ import annotations

from typing import TypedDict

import attrs


@attrs.frozen
class SignalTimedOut:
    """``ctx.wait_for_signal`` returns this instead of a payload when its timeout passed."""

    name: str


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
