"""The arguments of the main function's waits are checked where they are given, on
SQLite and PostgreSQL: a bad one fails the task with an ``InvalidArgument`` naming it
(cause ``workflow_error``), before anything is waited for or started.

Before, a timeout of ``timedelta.max`` failed the task with "OverflowError: date value
out of range", and 4000 days was accepted though ``ctx.sleep`` takes at most 3650."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    ChildHandle,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.outcomes import Failed, Idle, Suspended
from runifold_sync.store import TaskState
from tests.support.backends import contract_backend
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

TEN_YEARS = timedelta(days=3650)
WaitCall = Callable[[WorkflowContext], Any]


def _waiting(call: WaitCall) -> Workflow:
    wf = Workflow("waiting", 1, signals=["go"])

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> Any:
        return call(ctx)

    return wf


def _run(store: WorkflowStore, call: WaitCall) -> Any:
    store.enqueue(WorkflowTask.new("waiting", 1, None, checkpoint_id="t1"))
    return run_cycle(store, WorkflowDefinition(_waiting(call)))


def _fails_naming(store: WorkflowStore, call: WaitCall, message: str) -> None:
    outcome = _run(store, call)
    assert isinstance(outcome, Failed), outcome
    assert outcome.reason == f"workflow main raised InvalidArgument: {message}"
    assert outcome.cause == "workflow_error"
    assert store.get_task("t1").state is TaskState.TERMINAL
    assert [t.task_id for t in store.list_tasks()] == ["t1"]  # no child was started


HANDLE = ChildHandle("child-1", "waiting", 1)


def _signal(timeout: timedelta) -> WaitCall:
    return lambda ctx: ctx.wait_for_signal("go", timeout=timeout)


def _approval(timeout: timedelta) -> WaitCall:
    return lambda ctx: ctx.request_approval("go", approvers=["alice"], timeout=timeout)


def _escalation(timeout: timedelta) -> WaitCall:
    return lambda ctx: ctx.request_approval(
        "go", approvers=["alice"], timeout=timedelta(hours=1), escalate_to=["bob"], escalation_timeout=timeout
    )


def _child(timeout: timedelta) -> WaitCall:
    return lambda ctx: ctx.wait_child(HANDLE, timeout=timeout)


def _children(timeout: timedelta) -> WaitCall:
    return lambda ctx: ctx.wait_children([HANDLE], timeout=timeout)


def _run_child(timeout: timedelta) -> WaitCall:
    return lambda ctx: ctx.run_child("waiting", 1, None, timeout=timeout)


WAITS = [
    (_signal, "signal"),
    (_approval, "approval"),
    (_escalation, "approval escalation"),
    (_child, "child wait"),
    (_children, "child wait"),
    (_run_child, "child wait"),
]
IDS = ["signal", "approval", "escalation", "wait_child", "wait_children", "run_child"]


@pytest.mark.parametrize("too_long", [timedelta.max, timedelta(days=3651)], ids=["max", "3651-days"])
@pytest.mark.parametrize(("wait", "what"), WAITS, ids=IDS)
def test_a_wait_timeout_longer_than_ctx_sleep_takes_fails_the_task_naming_it(
    store: WorkflowStore, wait: Callable[[timedelta], WaitCall], what: str, too_long: timedelta
) -> None:
    _fails_naming(store, wait(too_long), f"{what} timeout must be at most 3650 days, got {too_long!r}")


@pytest.mark.parametrize(("wait", "what"), WAITS[:3], ids=IDS[:3])
def test_a_wait_timeout_of_exactly_ten_years_is_accepted(
    store: WorkflowStore, wait: Callable[[timedelta], WaitCall], what: str
) -> None:
    outcome = _run(store, wait(TEN_YEARS))
    assert isinstance(outcome, Suspended), outcome
    assert outcome.wake_at is not None
    assert run_cycle(store, WorkflowDefinition(_waiting(wait(TEN_YEARS)))) == Idle()


HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"approvers": [5]}, "approver in approvers must be a string, got 5"),
        ({"approvers": [["a"]]}, "approver in approvers must be a string, got ['a']"),
        ({"approvers": None}, "approvers must be a list of names, got None"),
        ({"approvers": 5}, "approvers must be a list of names, got 5"),
        (
            {"approvers": [" alice"]},
            "approver in approvers must be non-empty without surrounding spaces, got ' alice'",
        ),
        ({"approvers": []}, "approval 'go' needs at least one approver"),
        (
            {"approvers": ["alice"], "timeout": HOUR, "escalate_to": [None]},
            "approver in escalate_to must be a string, got None",
        ),
        (
            {"approvers": ["alice"], "timeout": HOUR, "escalate_to": None},
            "escalate_to must be a list of names, got None",
        ),
        (
            {"approvers": ["alice"], "escalate_to": ["bob"]},
            "approval 'go' escalates to ['bob'] but has no timeout: it would never escalate",
        ),
        (
            {"approvers": ["alice"], "timeout": HOUR, "escalation_timeout": HOUR},
            "approval 'go' has an escalation_timeout but no escalate_to: there is no escalation to time out",
        ),
    ],
    ids=[
        "number",
        "list",
        "none",
        "not-iterable",
        "padded",
        "empty",
        "escalate-to-none-name",
        "escalate-to-none",
        "escalation-without-timeout",
        "escalation-timeout-alone",
    ],
)
def test_request_approval_refuses_approvers_nobody_could_be_and_contradictory_options(
    store: WorkflowStore, arguments: dict[str, Any], message: str
) -> None:
    # Before: [5] and [["a"]]'s own problems were accepted (nobody can send as 5) or a
    # bare TypeError ("unhashable type"), None a bare TypeError, and an escalation without
    # a timeout (or an escalation_timeout without an escalation) silently ignored.
    _fails_naming(store, lambda ctx: ctx.request_approval("go", **arguments), message)


def test_an_approval_with_escalation_and_its_timeouts_waits_for_its_first_approvers(
    store: WorkflowStore,
) -> None:
    outcome = _run(
        store,
        lambda ctx: ctx.request_approval(
            "go", approvers=("alice",), timeout=HOUR, escalate_to=iter(["bob"]), escalation_timeout=HOUR
        ),
    )
    assert isinstance(outcome, Suspended), outcome
