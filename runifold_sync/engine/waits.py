"""Durable waits of the main function: timers, signals and approvals, and what they return.

A wait is journaled as pending with its deadline (store time) and suspends the task, so
the worker is freed; when the task is claimed again the replay reaches the same entry
and either finishes it (due, or the signal arrived) or suspends again. Waits belong in
the main function: a parallel branch that waits fails the task as misuse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model import validate
from ..model.checkpoint import EntryKind, EntryStatus, JournalEntry
from ..model.codec import from_json, structure
from ..store.base import WorkflowStore
from ..store.records import Signal
from ..store.signal_checks import approval_payload_problem
from ..workflow.waiting import ApprovalDecision, ApprovalTimedOut, SignalTimedOut
from .boundary import Boundary
from .commits import Commits
from .interrupts import FailRequested, SuspendRequested
from .replay import Cursor, finished
from .spans import ClaimSpans


@attrs.frozen
class OpenWait:
    """A durable wait not over: its pending journal entry (under the cursor), store now,
    and the deadline its timeout set when it began."""

    call_id: str
    entry: JournalEntry
    now: datetime
    due_at: datetime | None


def open_wait(
    cursor: Cursor,
    boundary: Boundary,
    store: WorkflowStore,
    name: str,
    kind: EntryKind,
    timeout: timedelta | None,
) -> dict[str, Any] | OpenWait:
    """The recorded output of a finished wait, or the wait open: its pending entry begun
    (when new) with the deadline ``timeout`` sets from store now, which later claims
    keep."""
    call_id, entry = cursor.take(name, kind)
    if entry is not None and finished(entry):
        output: dict[str, Any] = entry.output
        return output
    boundary.check_continue()
    now = store.now()
    if entry is None:
        due = None if timeout is None else (now + timeout).timestamp()
        entry = JournalEntry(call_id, kind, EntryStatus.PENDING, due=due)
        cursor.begin(entry)
    due_at = None if entry.due is None else datetime.fromtimestamp(entry.due, UTC)
    return OpenWait(call_id, entry, now, due_at)


Stage = tuple[frozenset[str], timedelta | None, bool]  # approvers, timeout, escalated


def approval_stages(
    name: str,
    approvers: object,
    timeout: timedelta | None,
    escalate_to: object,
    escalation_timeout: timedelta | None,
) -> list[Stage]:
    """The stages of ``ctx.request_approval``, every argument checked up front (the
    escalation's only once the first stage had timed out, days later, otherwise). An
    escalation needs the first stage's timeout, and an ``escalation_timeout`` an
    escalation: either alone would be silently ignored."""
    # Each approver a name, as a signal's sender is (a number could never send one).
    first = validate.names("approvers", approvers, kind="approver in approvers", shape="a list of names")
    if not first:
        raise InvalidArgument(f"approval {name!r} needs at least one approver")
    later = validate.names(
        "escalate_to", escalate_to, kind="approver in escalate_to", shape="a list of names"
    )
    if later and timeout is None:
        raise InvalidArgument(
            f"approval {name!r} escalates to {sorted(later)} but has no timeout: it would never escalate"
        )
    if escalation_timeout is not None and not later:
        raise InvalidArgument(
            f"approval {name!r} has an escalation_timeout but no escalate_to: there is no "
            "escalation to time out"
        )
    stages: list[Stage] = [(first, timeout, False)]
    if later:
        stages.append((later, escalation_timeout, True))
    return stages


# Why a delivered signal is refused by a wait (None: accepted), given its decoded payload.
Refusal = Callable[[Signal, Any], "str | None"]
# sender_policy(sender, signal name, payload) -> accept?
SenderPolicy = Callable[[str, str, Any], bool]


class Waits:
    """The waits of the main function's journal (``branch`` names the branch of a
    parallel call instead, where every wait is refused)."""

    def __init__(
        self,
        *,
        cursor: Cursor,
        commits: Commits,
        boundary: Boundary,
        store: WorkflowStore,
        workflow: str,
        signals: frozenset[str],
        sender_policy: SenderPolicy | None,
        branch: str | None,
        spans: ClaimSpans,
    ) -> None:
        self._cursor = cursor
        self._spans = spans
        self._commits = commits
        self._boundary = boundary
        self._store = store
        self._workflow = workflow  # how errors name the workflow
        self._signals = signals  # the names the workflow declares
        self._sender_policy = sender_policy
        self._branch = branch

    def timer(self, deadline: Callable[[datetime], datetime]) -> None:
        """Wait until ``deadline(store now)``, computed once, when the timer is new."""
        self._no_wait_in_branch("timer")
        call_id, entry = self._cursor.take("timer", EntryKind.TIMER)
        if finished(entry):
            return
        with self._spans.wait("timer", call_id) as span:
            now = self._store.now()
            if entry is None:
                self._boundary.check_continue()
                due = deadline(now).timestamp()
                entry = JournalEntry(call_id, EntryKind.TIMER, EntryStatus.PENDING, due=due)
                self._cursor.begin(entry)
            assert entry.due is not None
            due_at = datetime.fromtimestamp(entry.due, UTC)
            if now >= due_at:
                self._cursor.finish(entry, None)  # persisted with the next commit; replay re-derives it
                span.ended("fired")
                return
            raise SuspendRequested(due_at, f"waiting for timer {call_id} until {due_at.isoformat()}")

    def wait_for_signal(self, name: str, timeout: timedelta | None, payload_type: Any) -> Any:
        """A signal's payload structured as ``payload_type``, or ``SignalTimedOut``."""

        def refusal(signal: Signal, payload: Any) -> str | None:
            try:  # a payload the workflow cannot read is refused, not allowed to fail it
                structure(payload, payload_type)
            except Exception as exc:
                return f"payload does not fit {payload_type!r}: {type(exc).__name__}: {exc}"
            return self._policy_refusal(signal, payload)

        output = self._await_signal(name, timeout, refusal)
        if output.get("timed_out"):
            return SignalTimedOut(name)
        return structure(output["payload"], payload_type)

    def request_approval(
        self,
        name: str,
        approvers: Iterable[str],
        timeout: timedelta | None,
        escalate_to: Iterable[str],
        escalation_timeout: timedelta | None,
    ) -> ApprovalDecision | ApprovalTimedOut:
        """A decision signalled by an approver, asking ``escalate_to`` after a timeout."""
        stages = approval_stages(name, approvers, timeout, escalate_to, escalation_timeout)
        for allowed, stage_timeout, escalated in stages:

            def refusal(signal: Signal, payload: Any, allowed: frozenset[str] = allowed) -> str | None:
                if signal.sender not in allowed:
                    return f"{signal.sender!r} is not an approver of {name!r}"
                return approval_payload_problem(payload) or self._policy_refusal(signal, payload)

            output = self._await_signal(name, stage_timeout, refusal, approvers=allowed)
            if not output.get("timed_out"):
                payload = output["payload"]
                return ApprovalDecision(
                    name, output["sender"], payload["approved"], payload.get("reason"), escalated
                )
        return ApprovalTimedOut(name, escalated=len(stages) > 1)

    def _policy_refusal(self, signal: Signal, payload: Any) -> str | None:
        policy = self._sender_policy
        if policy is None:
            return None
        try:
            accepted = policy(signal.sender, signal.name, payload)
        except Exception as exc:  # the policy's bug refuses this signal; it must not fail the task
            return (
                f"sender {signal.sender!r} refused: the definition's sender policy raised "
                f"{type(exc).__name__}: {exc}"
            )
        if accepted:
            return None
        return f"sender {signal.sender!r} refused by the definition's sender policy"

    def _await_signal(
        self,
        name: str,
        timeout: timedelta | None,
        refusal: Refusal,
        approvers: frozenset[str] | None = None,
    ) -> dict[str, Any]:
        """The journal output of a signal wait: the accepted signal, or a timeout.
        ``approvers``: the wait is an approval, and the suspend tells the store who may
        decide it, so that anyone else's decision is refused where it is sent."""
        self._no_wait_in_branch(f"signal {name!r}")
        if name not in self._signals:
            raise FailRequested(f"signal {name!r} is not declared by {self._workflow}", cause="misuse")
        wait = open_wait(
            self._cursor, self._boundary, self._store, f"signal:{name}", EntryKind.SIGNAL, timeout
        )
        if not isinstance(wait, OpenWait):
            return wait
        call_id, entry, now, due_at = wait.call_id, wait.entry, wait.now, wait.due_at
        with self._spans.wait("signal" if approvers is None else "approval", call_id) as span:
            # The store keeps any name (it does not know the definition); the wait refuses the
            # names the definition does not declare, so they leave the pending count, and leaves
            # other declared names for their own wait.
            for signal in self._store.pending_signals(self._cursor.task_id):
                if signal.name not in self._signals:
                    note = f"signal {signal.name!r} is not declared by {self._workflow}"
                    self._commits.consume_signal(signal, call_id, accepted=False, note=note)
                    continue
                if signal.name != name:
                    continue
                payload = from_json(signal.payload_json)
                refused = refusal(signal, payload)
                if refused is None:
                    accepted = {"signal_id": signal.signal_id, "sender": signal.sender, "payload": payload}
                    self._cursor.finish(entry, accepted)
                note = refused or f"accepted by {call_id}"
                self._commits.consume_signal(signal, call_id, accepted=refused is None, note=note)
                if refused is None:
                    span.ended("received")
                    return dict(entry.output)
            if due_at is not None and now >= due_at:
                self._cursor.finish(entry, {"timed_out": True})
                span.ended("timed_out")
                return dict(entry.output)
            until = "" if due_at is None else f" until {due_at.isoformat()}"
            raise SuspendRequested(
                due_at, f"waiting for signal {name!r}{until}", signal=name, approvers=approvers
            )

    def _no_wait_in_branch(self, what: str) -> None:
        if self._branch is not None:
            raise FailRequested(
                f"branch {self._branch!r} waits for a {what}; durable waits belong in the "
                "main function, not in parallel branches",
                cause="misuse",
            )
