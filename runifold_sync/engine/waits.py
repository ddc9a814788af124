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

from ..errors import ChildFailed, InvalidArgument
from ..model import validate
from ..model.checkpoint import EntryKind, EntryStatus, JournalEntry
from ..model.codec import from_json, structure, to_json
from ..model.values import TaskOutcome, TaskState
from ..store import checks
from ..store.base import WorkflowStore
from ..store.records import Signal, TaskRecord
from ..store.signal_checks import approval_payload_problem
from ..workflow.registry import WorkflowDefinition
from ..workflow.waiting import (
    ApprovalDecision,
    ApprovalTimedOut,
    ChildHandle,
    Fired,
    SignalReceived,
    SignalTimedOut,
    Update,
    WaitItem,
)
from .boundary import Boundary
from .interrupts import FailRequested, SuspendRequested
from .replay import Cursor, finished


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
    until: datetime | None = None,
) -> dict[str, Any] | OpenWait:
    """The recorded output of a finished wait, or the wait open: its pending entry begun
    (when new) with the deadline ``timeout`` sets from store now (or the moment
    ``until``), which later claims keep."""
    call_id, entry = cursor.take(name, kind)
    if entry is not None and finished(entry):
        output: dict[str, Any] = entry.output
        return output
    boundary.check_continue(waiting=True)
    now = store.now()
    if entry is None:
        due = None if timeout is None else (now + timeout).timestamp()
        if until is not None:
            due = until.timestamp()
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
# An update's validator (``@workflow.validator``): raising rejects the payload.
Validator = Callable[[Any], object]


class Waits:
    """The waits of the main function's journal (``branch`` names the branch of a
    parallel call instead, where every wait is refused)."""

    def __init__(self, cursor: Cursor, boundary: Boundary, definition: WorkflowDefinition) -> None:
        self._cursor = cursor
        self._boundary = boundary
        self._commits = boundary.commits
        self._store = boundary.commits.store
        self._spans = boundary.claim.spans
        self._workflow = definition.workflow  # errors name it (by its repr), rarely: not made here
        self._signals = definition.workflow.signals  # the names the workflow declares
        self._sender_policy = definition.sender_policy
        self._branch = None if boundary.branch is None else boundary.branch.key

    def timer(self, deadline: Callable[[datetime], datetime]) -> None:
        """Wait until ``deadline(store now)``, computed once, when the timer is new."""
        self._no_wait_in_branch("timer")
        call_id, entry = self._cursor.take("timer", EntryKind.TIMER)
        if finished(entry):
            return
        with self._spans.wait("timer", call_id) as span:
            now = self._store.now()
            if entry is None:
                self._boundary.check_continue(waiting=True)
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

        output = self._await_signal((name,), timeout, refusal)
        if output.get("timed_out"):
            return SignalTimedOut(name)
        return structure(output["payload"], payload_type)

    def wait_for_signals(
        self, names: tuple[str, ...], timeout: timedelta | None, until: datetime | None, payload_type: Any
    ) -> SignalReceived | SignalTimedOut:
        """The first of ``names`` to arrive (its payload structured as ``payload_type``),
        or ``SignalTimedOut`` at ``timeout`` from the wait's start or at ``until``."""

        def refusal(signal: Signal, payload: Any) -> str | None:
            try:
                structure(payload, payload_type)
            except Exception as exc:
                return f"payload does not fit {payload_type!r}: {type(exc).__name__}: {exc}"
            return self._policy_refusal(signal, payload)

        output = self._await_signal(names, timeout, refusal, until=until)
        label = "|".join(names)
        if output.get("timed_out"):
            return SignalTimedOut(label)
        return SignalReceived(output.get("name", names[0]), structure(output["payload"], payload_type))

    def now(self) -> datetime:
        """Store time, read once and recorded (``EntryKind.NOW``); replayed after that."""
        call_id, entry = self._cursor.take("now", EntryKind.NOW)
        if entry is not None:
            return datetime.fromisoformat(entry.output)
        self._boundary.claim.check_lease()
        now = self._store.now().astimezone(UTC)
        self._cursor.record(JournalEntry(call_id, EntryKind.NOW, EntryStatus.DONE, now.isoformat()))
        return now

    def wait_for_update(
        self, name: str, timeout: timedelta | None, payload_type: Any, validator: Validator | None
    ) -> Update | SignalTimedOut:
        """An update (a signal ``name``) that ``validator`` accepts, or ``SignalTimedOut``.
        A rejected one is answered first (event ``update:<id>`` holds the rejection, which
        the caller's ``store.update`` reads), then taken out of the pending signals
        without a journal entry: replayed, the wait knows nothing of it. A crash between
        the two leaves it pending, and the next claim's wait rejects it again."""

        def refusal(signal: Signal, payload: Any) -> str | None:
            try:
                structured = structure(payload, payload_type)
            except Exception as exc:
                return f"payload does not fit {payload_type!r}: {type(exc).__name__}: {exc}"
            refused = self._policy_refusal(signal, payload)
            if refused is not None or validator is None:
                return refused
            try:
                validator(structured)
            except Exception as exc:  # the validator's verdict, whatever it raised
                return f"rejected by the validator of update {name!r}: {type(exc).__name__}: {exc}"
            return None

        def answer_refusal(signal: Signal, note: str) -> None:
            self._commits.commit_event(checks.update_event_key(signal.signal_id), to_json({"rejected": note}))

        output = self._await_signal((name,), timeout, refusal, on_refused=answer_refusal)
        if output.get("timed_out"):
            return SignalTimedOut(name)
        return Update(output["signal_id"], name, output["sender"], structure(output["payload"], payload_type))

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

            output = self._await_signal((name,), stage_timeout, refusal, approvers=allowed)
            if not output.get("timed_out"):
                payload = output["payload"]
                return ApprovalDecision(
                    name, output["sender"], payload["approved"], payload.get("reason"), escalated
                )
        return ApprovalTimedOut(name, escalated=len(stages) > 1)

    def wait_any(self, items: tuple[WaitItem, ...], result_type: Any, payload_type: Any) -> Fired:
        """The first of ``items`` to fire (see ``WorkflowContext.wait_any``)."""
        self._no_wait_in_branch("wait_any")
        names = [item for item in items if isinstance(item, str)]
        for name in names:
            if name not in self._signals:
                raise FailRequested(f"signal {name!r} is not declared by {self._workflow}", cause="misuse")
        output = self._first_of(items, names, payload_type)
        index = output["index"]
        item = items[index]
        if "child" in output:
            ended = output["child"]
            if ended["outcome"] != TaskOutcome.COMPLETED.value:
                return Fired(index, item, ChildFailed(ended["task_id"], ended["outcome"], ended["reason"]))
            return Fired(index, item, structure(ended["result"], result_type))
        if "signal_id" in output:
            return Fired(index, item, structure(output["payload"], payload_type), output["name"])
        return Fired(index, item, None)

    def _first_of(self, items: tuple[WaitItem, ...], names: list[str], payload_type: Any) -> dict[str, Any]:
        """The journal output of a ``wait_any``: the index of what fired first and what it
        brought. Its timers' deadlines are fixed when the wait begins (kept in the pending
        entry); what fired is committed at once, so a replay never decides again."""
        call_id, entry = self._cursor.take("any", EntryKind.ANY)
        if entry is not None and finished(entry):
            done: dict[str, Any] = entry.output
            return done
        self._boundary.check_continue(waiting=True)
        now = self._store.now()
        if entry is None:
            timers = {}
            for index, item in enumerate(items):
                if isinstance(item, timedelta):
                    timers[str(index)] = (now + item).timestamp()
                elif isinstance(item, datetime):
                    timers[str(index)] = item.timestamp()
            due = min(timers.values()) if timers else None
            entry = JournalEntry(call_id, EntryKind.ANY, EntryStatus.PENDING, {"timers": timers}, due=due)
            self._cursor.begin(entry)
        timers = dict(entry.output["timers"])
        with self._spans.wait("any", call_id) as span:
            accepted = self._signals_for(call_id, names, payload_type) if names else {}
            handles = [item.task_id for item in items if isinstance(item, ChildHandle)]
            children = dict(zip(handles, self._store.task_records(handles), strict=True))
            for index, item in enumerate(items):
                if isinstance(item, ChildHandle):
                    record = children[item.task_id]
                    if record.state in (TaskState.TERMINAL, TaskState.CANCELLED):
                        return self._fired(entry, {"index": index, "child": _child_ending(record)}, span)
                elif isinstance(item, str):
                    signal = accepted.get(item)
                    if signal is not None:
                        output = {
                            "index": index,
                            "name": signal.name,
                            "signal_id": signal.signal_id,
                            "sender": signal.sender,
                            "payload": from_json(signal.payload_json),
                        }
                        self._cursor.finish(entry, output)
                        self._commits.consume_signal(
                            signal, call_id, accepted=True, note=f"accepted by {call_id}"
                        )
                        span.ended("fired")
                        return output
                elif now.timestamp() >= timers[str(index)]:
                    return self._fired(entry, {"index": index}, span)
            wake = min(timers.values()) if timers else None
            wake_at = None if wake is None else datetime.fromtimestamp(wake, UTC)
            waiting = [str(item) if not isinstance(item, ChildHandle) else item.task_id for item in items]
            raise SuspendRequested(
                wake_at,
                f"waiting for the first of {', '.join(waiting)}",
                signal="\n".join(names) or None,
                child="\n".join(children) or None,
            )

    def _fired(self, entry: JournalEntry, output: dict[str, Any], span: Any) -> dict[str, Any]:
        """Record what fired and commit it at once: the choice must not be made again."""
        self._cursor.finish(entry, output)
        self._commits.commit(entry.call_id)
        span.ended("fired")
        return output

    def _signals_for(self, call_id: str, names: list[str], payload_type: Any) -> dict[str, Signal]:
        """The oldest acceptable pending signal of each of ``names``; those refused on the
        way (undeclared names, payloads that do not fit, senders the policy refuses) are
        consumed as refused, as any signal wait does."""
        found: dict[str, Signal] = {}
        for signal in self._store.pending_signals(self._cursor.task_id):
            if signal.name not in self._signals:
                note = f"signal {signal.name!r} is not declared by {self._workflow}"
                self._commits.consume_signal(signal, call_id, accepted=False, note=note)
                continue
            if signal.name not in names or signal.name in found:
                continue
            payload = from_json(signal.payload_json)
            try:
                structure(payload, payload_type)
                refused = self._policy_refusal(signal, payload)
            except Exception as exc:
                refused = f"payload does not fit {payload_type!r}: {type(exc).__name__}: {exc}"
            if refused is not None:
                self._commits.consume_signal(signal, call_id, accepted=False, note=refused)
                continue
            found[signal.name] = signal
        return found

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
        names: tuple[str, ...],
        timeout: timedelta | None,
        refusal: Refusal,
        approvers: frozenset[str] | None = None,
        until: datetime | None = None,
        on_refused: Callable[[Signal, str], None] | None = None,
    ) -> dict[str, Any]:
        """The journal output of a signal wait for the first of ``names``: the accepted
        signal (with its name when there are several), or a timeout. ``approvers``: the
        wait is an approval, and the suspend tells the store who may decide it, so that
        anyone else's decision is refused where it is sent."""
        name = "|".join(names)  # the wait's label: its call id and what its reason shows
        self._no_wait_in_branch(f"signal {name!r}")
        for one in names:
            if one not in self._signals:
                raise FailRequested(f"signal {one!r} is not declared by {self._workflow}", cause="misuse")
        wait = open_wait(
            self._cursor, self._boundary, self._store, f"signal:{name}", EntryKind.SIGNAL, timeout, until
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
                if signal.name not in names:
                    continue
                payload = from_json(signal.payload_json)
                refused = refusal(signal, payload)
                if refused is None:
                    accepted = {"signal_id": signal.signal_id, "sender": signal.sender, "payload": payload}
                    if len(names) > 1:
                        accepted["name"] = signal.name
                    self._cursor.finish(entry, accepted)
                if refused is not None and on_refused is not None:
                    on_refused(signal, refused)
                note = refused or f"accepted by {call_id}"
                self._commits.consume_signal(signal, call_id, accepted=refused is None, note=note)
                if refused is None:
                    span.ended("received")
                    return dict(entry.output)
            if due_at is not None and now >= due_at:
                self._cursor.finish(entry, {"timed_out": True})
                span.ended("timed_out")
                return dict(entry.output)
            deadline = "" if due_at is None else f" until {due_at.isoformat()}"
            raise SuspendRequested(
                due_at,
                f"waiting for signal {name!r}{deadline}",
                # The store wakes the task for any of the names (one a line: a name is printable).
                signal="\n".join(names),
                approvers=approvers,
            )

    def _no_wait_in_branch(self, what: str) -> None:
        if self._branch is not None:
            raise FailRequested(
                f"branch {self._branch!r} waits for a {what}; durable waits belong in the "
                "main function, not in parallel branches",
                cause="misuse",
            )


def _child_ending(record: TaskRecord) -> dict[str, Any]:
    """How a child ended, as a ``wait_any`` keeps it (as ``wait_children`` does)."""
    if record.state is TaskState.CANCELLED:
        outcome = "cancelled"
    else:
        assert record.outcome is not None
        outcome = record.outcome.value
    result = record.result if outcome == TaskOutcome.COMPLETED.value else None
    return {"task_id": record.task_id, "outcome": outcome, "reason": record.reason, "result": result}
