"""What the store checks of a signal where it is sent, before keeping it.

The wait that takes a signal has the last word (it knows the payload type and runs the
definition's sender policy), but a signal it would refuse for certain should not be kept
until then: it would count toward the task's cap of pending signals, and its sender would
hear "delivered". So the store refuses what it can already judge:

- a name the task's definition version does not declare, once a registry has told the
  store that version's signals (``runifold_definitions``: written when a task is enqueued
  through ``WorkflowRegistry.task`` and when a worker serving the version starts). Every
  fingerprint recorded for the version counts, so during a deploy that changed a
  version's signals a name either side declares is kept, never refused by mistake;
- while the task waits for an approval of that name: a sender who is not one of its
  approvers, and a payload that is not a decision (``waiting_approval``, written by the
  suspend that began the wait, with the fencing token of its lease: a later claim raises
  the token, so a rule left behind by an earlier wait is never applied to a new one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..model.codec import from_json, to_json
from .dialect import Row
from .records import SignalCheck


def approval_payload_problem(payload: Any) -> str | None:
    """Approval signals carry ``{"approved": bool, "reason": str | None}``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        return 'an approval payload must be {"approved": true|false, "reason": "..."}'
    if not isinstance(payload.get("reason", ""), (str, type(None))):
        return "an approval reason must be text"
    return None


def waiting_approval(approvers: Iterable[str] | None, fencing_token: int) -> str | None:
    """The ``waiting_approval`` a suspend stores: who may decide the approval the task
    now waits for, under the lease that wrote it; None for any other wait."""
    if approvers is None:
        return None
    # Senders are strings, so an approver that is not one could never decide anyway.
    names = sorted({a for a in approvers if isinstance(a, str)})
    return to_json({"approvers": names, "fencing_token": fencing_token})


@attrs.frozen
class Verdict:
    """What was checked of a delivery and, when it may not be kept, why (``refusal``)
    and which of its fields is wrong (``field``: name, sender or payload)."""

    checked: SignalCheck
    refusal: str | None = None
    field: str | None = None


def judge(task: Row, declared: Sequence[Row], name: str, sender: str, payload_text: str) -> Verdict:
    """The verdict on signal ``name`` from ``sender`` for ``task`` (its row, as query
    ``lock_task`` reads it), given the rows of ``declared_signals`` for its version."""
    # waiting_for_signal holds the names a wait takes, one a line (an approval's is one name).
    waiting = task["state"] == "waiting" and name in (task["waiting_for_signal"] or "").split("\n")
    checked = SignalCheck.WAITING if waiting else SignalCheck.DECLARED if declared else SignalCheck.UNCHECKED
    if declared:
        names = sorted(frozenset().union(*(from_json(row["signals"]) for row in declared)))
        if name not in names:
            it_declares = f"it declares {', '.join(map(repr, names))}" if names else "it declares none"
            why = (
                f"signal {name!r} is not declared by {task['definition_name']!r} version "
                f"{task['definition_version']} ({it_declares})"
            )
            return Verdict(checked, why, "name")
    approvers = _approvers(task) if waiting else None
    if approvers is not None:
        if sender not in approvers:
            why = f"{sender!r} is not an approver of {name!r} (its approvers now: {', '.join(approvers)})"
            return Verdict(checked, why, "sender")
        problem = approval_payload_problem(from_json(payload_text))
        if problem is not None:
            return Verdict(checked, problem, "payload")
    return Verdict(checked)


def _approvers(task: Row) -> list[str] | None:
    """The approvers of the approval ``task`` waits for, if its current wait wrote them."""
    text = task["waiting_approval"]
    if text is None:
        return None
    rule = from_json(text)
    if rule.get("fencing_token") != task["fencing_token"]:
        return None  # written by an earlier wait; the current one (an older release's?) did not
    approvers: list[str] = rule["approvers"]
    return approvers
