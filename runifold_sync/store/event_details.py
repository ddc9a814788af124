"""The ``detail`` of each history event, built once so every backend records the same
keys (operators, the CLI and the chaos audit read them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..model.outcomes import FailureDetail
from ..model.values import WorkflowTask


def enqueued(task: WorkflowTask) -> dict[str, Any]:
    detail: dict[str, Any] = {"definition": task.definition_name, "version": task.definition_version}
    if task.parent_id is not None:
        detail["parent"] = task.parent_id
    if task.queue != "default":
        detail["queue"] = task.queue
    return detail


def claimed(from_state: str, previous_worker: str | None) -> dict[str, Any]:
    """As PostgreSQL's claim statement builds it in SQL (``claimed_events``)."""
    detail: dict[str, Any] = {"from_state": from_state}
    if from_state == "leased":
        detail["expired_owner"] = previous_worker
    return detail


def operator(actor: str, reason: str) -> dict[str, Any]:
    """A cancel or requeue: who asked and why."""
    return {"actor": actor, "reason": reason}


def signal(
    signal_id: str, name: str, sender: str, reason: str | None, refused: str | None = None
) -> dict[str, Any]:
    detail: dict[str, Any] = {"signal_id": signal_id, "name": name, "sender": sender, "reason": reason}
    if refused is not None:
        detail["refused"] = refused
    return detail


def retried(reason: str, delay: timedelta) -> dict[str, Any]:
    return {"reason": reason, "delay_s": delay.total_seconds()}


def failed(reason: str, ambiguous_effect: str | None, error: FailureDetail | None = None) -> dict[str, Any]:
    """With ``error`` (what the worker found failed), its class and the call it failed
    in, so ``show`` tells them apart without parsing the reason, and its traceback when
    it has one (the key is absent otherwise, as in events written before it was kept)."""
    detail: dict[str, Any] = {"reason": reason}
    if ambiguous_effect is not None:
        detail["ambiguous_effect"] = ambiguous_effect
    if error is not None:
        detail.update(error_class=error.error_class, step_id=error.step_id, effect_key=error.effect_key)
        if error.traceback is not None:
            detail["traceback"] = error.traceback
    return detail


def resolved(effect_key: str, applied: bool, actor: str, reason: str) -> dict[str, Any]:
    return {"effect_key": effect_key, "applied": applied, "actor": actor, "reason": reason}
