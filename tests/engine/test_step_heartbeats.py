"""A step body that sees its run, on every backend, with real workers and their heartbeat
threads:

- ``ctx.heartbeat(details)`` commits ``details`` for the step's call; the next attempt of
  that call (after a retry, a pause, or a crash: ``test_verb_crash_points``) reads them as
  ``ctx.last_heartbeat``, so a long body resumes where it got to; a completed step
  leaves none behind;
- ``ctx.cancelled`` turns true once the heartbeat thread hears of a cancel or pause, so a
  long body stops early: a cancelled task ends cancelled, a paused one parks and runs the
  step again (from its last heartbeat) once resumed; a body that raised because it was
  told to stop is not counted as a failed attempt;
- ``ctx.set_event`` from a body publishes at once, before the step completes;
- bad details are refused at the call, and a transaction step, whose body runs inside
  the store transaction, cannot commit details or events of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Cancelled, Completed, Failed, Suspended
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
BEAT = timedelta(milliseconds=50)
SEEN: list[Any] = []  # what the bodies saw, in order
STARTED = threading.Event()
LIMIT_S = 20.0  # a body that never sees its cancel gives up here, and the test fails


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    SEEN.clear()
    STARTED.clear()
    yield
    SEEN.clear()


def worker_for(store: WorkflowStore, workflow: Workflow, worker_id: str = "w1") -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(store, registry, WorkerId.parse(worker_id), LEASE, BEAT)


def run_once(store: WorkflowStore, workflow: Workflow, worker_id: str = "w1") -> Any:
    worker = worker_for(store, workflow, worker_id)
    try:
        return worker.run_once()
    finally:
        worker.close()


def checkpoint(store: WorkflowStore, task_id: str) -> Checkpoint:
    found = read_checkpoint(store, task_id)
    assert found is not None
    return found


# --- a long step told to stop ----------------------------------------------------------------

crunch = Workflow("crunch", 1)


class Stopped(Exception):
    """What the body raises when told to stop."""


@crunch.step()
def work(ctx: StepContext, items: int) -> int:
    start = 0 if ctx.last_heartbeat is None else ctx.last_heartbeat["next"]
    SEEN.append(("start", start))
    deadline = time.monotonic() + LIMIT_S
    for item in range(start, items):
        ctx.heartbeat({"next": item + 1})
        if item == 2:
            ctx.set_event("progress", {"next": item + 1})
            STARTED.set()
        if item >= 2:  # from here on it waits to be told, as a long body would work
            while not ctx.cancelled and time.monotonic() < deadline and "go on" not in SEEN:
                time.sleep(0.01)
            if ctx.cancelled:
                SEEN.append(("stopped at", item + 1))
                raise Stopped(f"told to stop after item {item}")
    return items


@crunch.main
def crunch_main(ctx: WorkflowContext, items: int) -> int:
    return work(ctx, items)


def _run_in_thread(store: WorkflowStore, workflow: Workflow) -> tuple[threading.Thread, list[Any]]:
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.append(run_once(store, workflow)))
    thread.start()
    assert STARTED.wait(LIMIT_S)
    return thread, outcomes


def test_a_cancel_seen_by_the_heartbeat_thread_stops_a_long_body_early(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("crunch", 1, 5, checkpoint_id="t1"))
    began = time.monotonic()
    thread, outcomes = _run_in_thread(store, crunch)
    assert store.get_event("t1", "progress") == {"next": 3}  # published from inside the body
    store.cancel("t1", "ops", "not needed")
    thread.join(LIMIT_S)
    assert isinstance(outcomes[0], Cancelled), outcomes
    assert time.monotonic() - began < LIMIT_S / 2  # it stopped early, not at its limit
    assert SEEN == [("start", 0), ("stopped at", 3)]
    assert checkpoint(store, "t1").step_failures == {}  # not counted as a failed attempt


def test_a_paused_body_stops_and_its_next_attempt_resumes_from_its_last_heartbeat(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("crunch", 1, 5, checkpoint_id="t1"))
    thread, outcomes = _run_in_thread(store, crunch)
    store.pause("t1", actor="ops", reason="maintenance")
    thread.join(LIMIT_S)
    assert isinstance(outcomes[0], Suspended), outcomes
    assert checkpoint(store, "t1").heartbeats == {"work#1": {"next": 3}}
    assert checkpoint(store, "t1").step_failures == {}

    store.resume("t1", actor="ops", reason="done")
    SEEN.append("go on")
    assert run_once(store, crunch, "w2") == Completed("t1", 5)
    assert SEEN[:2] == [("start", 0), ("stopped at", 3)]
    assert SEEN[3] == ("start", 3)  # resumed where the first attempt got to
    assert checkpoint(store, "t1").heartbeats == {}  # completed: nothing left behind


# --- bad input --------------------------------------------------------------------------------

bad = Workflow("bad-beat", 1)


@bad.step()
def beat_badly(ctx: StepContext, _: None) -> str:
    for details, field in ((float("nan"), "details"), (object(), "details")):
        with pytest.raises(InvalidArgument, match=field):
            ctx.heartbeat(details)
    with pytest.raises(InvalidArgument, match="event key"):
        ctx.set_event("", 1)
    return "refused"


@bad.transaction()
def in_transaction(ctx: StepContext, _: str) -> str:
    with pytest.raises(InvalidArgument, match="transaction step"):
        ctx.heartbeat({"n": 1})
    with pytest.raises(InvalidArgument, match="transaction step"):
        ctx.set_event("stage", "x")
    ctx.heartbeat()  # no details: nothing to commit, allowed
    return f"{ctx.cancelled}"


@bad.main
def bad_main(ctx: WorkflowContext, _: None) -> list[str]:
    return [beat_badly(ctx, None), in_transaction(ctx, "x")]


def test_bad_details_and_a_transaction_steps_commits_are_refused_at_the_call(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("bad-beat", 1, None, checkpoint_id="t1"))
    outcome = run_once(store, bad)
    assert not isinstance(outcome, Failed), outcome.reason
    assert outcome == Completed("t1", ["refused", "False"])
