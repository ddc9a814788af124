"""What durable waits on signals and approvals return."""

from __future__ import annotations

from typing import Any

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


def approval_payload_problem(payload: Any) -> str | None:
    """Approval signals carry ``{"approved": bool, "reason": str | None}``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        return 'an approval payload must be {"approved": true|false, "reason": "..."}'
    if not isinstance(payload.get("reason", ""), (str, type(None))):
        return "an approval reason must be text"
    return None
