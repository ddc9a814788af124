"""``ctx.now()``, ``wait_for_signal(..., until=)`` and a signal wait for several names, on
every backend, run by real workers (one per cycle) over real stores.

- ``ctx.now()`` reads store time once and records it in the journal; every replay
  returns the recorded value, whatever the clock says by then;
- ``until=`` sets a wait's deadline at a moment (the suspend's wake time), beside the
  relative ``timeout=``; giving both is refused at the call;
- a wait for several names ends at the first of them to arrive and says which, the store
  waking the task for any of them; the others stay pending for a later wait.

(The crash points around these are in ``tests/system/test_verb_crash_points.py``.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runifold_sync import (
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.workflow.waiting import SignalReceived, SignalTimedOut
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend


def run_once(store: WorkflowStore, workflow: Workflow, worker_id: str = "w1") -> Any:
    return run_cycle(store, WorkflowDefinition(workflow), worker_id=worker_id)


# --- ctx.now() ------------------------------------------------------------------------------

clocked = Workflow("clocked", 1)


@clocked.main
def clocked_main(ctx: WorkflowContext, _: None) -> dict[str, Any]:
    started = ctx.now()
    ctx.sleep(timedelta(minutes=5))
    woke = ctx.now()
    return {"started": started.isoformat(), "woke": woke.isoformat(), "aware": started.tzinfo is not None}


def test_now_is_store_time_recorded_once_and_replayed(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("clocked", 1, None, checkpoint_id="t1"))
    before = store.now()
    assert isinstance(run_once(store, clocked), Suspended)
    recorded = [e for e in entries(store, "t1") if e["kind"] == "now"]
    assert [e["call_id"] for e in recorded] == ["now#1"]
    started = datetime.fromisoformat(recorded[0]["output"])
    assert before <= started <= store.now()

    clock.advance(timedelta(minutes=6))  # the replay runs six minutes of store time later
    outcome = run_once(store, clocked, "w2")
    assert isinstance(outcome, Completed), outcome
    assert outcome.result["started"] == started.isoformat()  # replayed, not read again
    woke = datetime.fromisoformat(outcome.result["woke"])
    assert woke - started >= timedelta(minutes=6)
    assert woke.utcoffset() == timedelta(0) and outcome.result["aware"] is True
    assert [e["call_id"] for e in entries(store, "t1") if e["kind"] == "now"] == ["now#1", "now#2"]


# --- until= ---------------------------------------------------------------------------------

deadline_flow = Workflow("deadline", 1, signals=["go"])


@deadline_flow.main
def deadline_main(ctx: WorkflowContext, until: str) -> Any:
    got = ctx.wait_for_signal("go", until=datetime.fromisoformat(until))
    return "timed out" if isinstance(got, SignalTimedOut) else got


def test_a_signal_wait_until_a_moment_wakes_then_and_times_out(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    until = (store.now() + timedelta(hours=2)).astimezone(UTC).replace(microsecond=0)
    store.enqueue(WorkflowTask.new("deadline", 1, until.isoformat(), checkpoint_id="t1"))
    outcome = run_once(store, deadline_flow)
    assert isinstance(outcome, Suspended) and outcome.wake_at == until
    assert [e["due"] for e in entries(store, "t1")] == [until.timestamp()]
    clock.advance(timedelta(hours=2, minutes=1))
    assert run_once(store, deadline_flow, "w2") == Completed("t1", "timed out")


def test_a_signal_wait_until_a_moment_takes_a_signal_before_it(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    until = store.now() + timedelta(hours=2)
    store.enqueue(WorkflowTask.new("deadline", 1, until.isoformat(), checkpoint_id="t1"))
    assert isinstance(run_once(store, deadline_flow), Suspended)
    store.send_signal("t1", "go", {"ok": 1}, signal_id="s1", sender="alice")
    assert run_once(store, deadline_flow, "w2") == Completed("t1", {"ok": 1})


both_flow = Workflow("both", 1, signals=["go"])


@both_flow.main
def both_main(ctx: WorkflowContext, _: None) -> Any:
    return ctx.wait_for_signal("go", timeout=timedelta(hours=1), until=datetime(2030, 1, 1, tzinfo=UTC))


naive_flow = Workflow("naive", 1, signals=["go"])


@naive_flow.main
def naive_main(ctx: WorkflowContext, _: None) -> Any:
    return ctx.wait_for_signal("go", until=datetime(2030, 1, 1))  # noqa: DTZ001 (the bad input)


@pytest.mark.parametrize(
    ("flow", "message"),
    [
        (
            both_flow,
            "signal wait takes timeout or until, not both, got datetime.timedelta(seconds=3600) "
            "and datetime.datetime(2030, 1, 1, 0, 0, tzinfo=datetime.timezone.utc)",
        ),
        (
            naive_flow,
            "signal wait until must be a timezone-aware datetime, got datetime.datetime(2030, 1, 1, 0, 0)",
        ),
    ],
)
def test_a_bad_until_fails_at_the_call_naming_it(backend: Backend, flow: Workflow, message: str) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new(flow.name, 1, None, checkpoint_id="t1"))
    outcome = run_once(store, flow)
    assert isinstance(outcome, Failed) and message in outcome.reason, outcome
    assert outcome.error is not None and outcome.error.error_class == "InvalidArgument"


bad_names = Workflow("bad-names", 1, signals=["go", "stop"])


@bad_names.main
def bad_names_main(ctx: WorkflowContext, _: None) -> dict[str, str]:
    refused = {}
    cases: dict[str, Any] = {"empty": [], "number": 5, "not text": ["go", 7], "twice": ["go", "go"]}
    for case, names in cases.items():
        try:
            ctx.wait_for_signal(names)
        except InvalidArgument as exc:
            refused[case] = str(exc)
    return refused


def test_bad_signal_names_are_refused_at_the_call_naming_them(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("bad-names", 1, None, checkpoint_id="t1"))
    assert run_once(store, bad_names) == Completed(
        "t1",
        {
            "empty": "signal wait name must be a name or a non-empty list of names, got []",
            "number": "signal wait name must be a name or a non-empty list of names, got 5",
            "not text": "signal wait names must be strings, got ['go', 7]",
            "twice": "signal wait names must be distinct, got ['go', 'go']",
        },
    )
    assert entries(store, "t1") == []  # refused before any wait was kept


# --- several names --------------------------------------------------------------------------

decide = Workflow("decide", 1, signals=["approve", "reject", "note"])


@decide.main
def decide_main(ctx: WorkflowContext, _: None) -> Any:
    first = ctx.wait_for_signal(["approve", "reject"], timeout=timedelta(days=1))
    assert isinstance(first, SignalReceived | SignalTimedOut)
    if isinstance(first, SignalTimedOut):
        return {"timed out": first.name}
    later = ctx.wait_for_signal(["approve", "reject"])  # the other one, kept pending
    assert isinstance(later, SignalReceived)
    return {"first": [first.name, first.payload], "later": [later.name, later.payload]}


def test_a_wait_for_several_names_ends_at_the_first_and_keeps_the_others(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("decide", 1, None, checkpoint_id="t1"))
    outcome = run_once(store, decide)
    assert isinstance(outcome, Suspended) and outcome.reason.startswith("waiting for signal 'approve|reject'")
    store.send_signal("t1", "note", "unrelated", signal_id="n1", sender="bob")
    assert store.get_task("t1").ready_at is None or store.get_task("t1").ready_at > store.now()
    delivery = store.send_signal("t1", "reject", {"why": "late"}, signal_id="s1", sender="alice")
    assert delivery.checked.value == "waiting"  # the store knows the task waits for it
    task = store.get_task("t1")
    assert task.ready_at is not None and task.ready_at <= store.now()  # the store woke it for "reject"
    store.send_signal("t1", "approve", {"ok": True}, signal_id="s2", sender="carol")
    outcome = run_once(store, decide, "w2")
    assert outcome == Completed(
        "t1", {"first": ["reject", {"why": "late"}], "later": ["approve", {"ok": True}]}
    ), outcome
    waits = [e for e in entries(store, "t1") if e["kind"] == "signal"]
    assert [(e["call_id"], e["output"]["name"]) for e in waits] == [
        ("signal:approve|reject#1", "reject"),
        ("signal:approve|reject#2", "approve"),
    ]


def test_a_wait_for_several_names_times_out_naming_them(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("decide", 1, None, checkpoint_id="t1"))
    assert isinstance(run_once(store, decide), Suspended)
    clock.advance(timedelta(days=1, minutes=1))
    assert run_once(store, decide, "w2") == Completed("t1", {"timed out": "approve|reject"})


undeclared = Workflow("undeclared", 1, signals=["approve"])


@undeclared.main
def undeclared_main(ctx: WorkflowContext, _: None) -> Any:
    return ctx.wait_for_signal(["approve", "nope"])


def test_a_wait_for_an_undeclared_name_among_several_fails_the_task(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("undeclared", 1, None, checkpoint_id="t1"))
    outcome = run_once(store, undeclared)
    assert isinstance(outcome, Failed) and "signal 'nope' is not declared" in outcome.reason
