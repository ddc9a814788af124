"""Events on every backend: ``ctx.set_event`` in a workflow run by a worker publishes a
JSON value under a key (last write wins), committed before the call returns together
with the progress made so far, and ``store.get_event`` reads it, waiting for it when
given a timeout.

Replay never publishes again what it replays: a caller reading the events while a
resumed run replays its earlier calls sees the newest value, and the stored time of an
event set before the resume does not move. (A worker killed around the event's commit is
in the crash-point matrix, ``tests/system/test_crash_points.py``.)

Store time is moved with the shared clock offset; each cycle runs on a new worker.
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
from runifold_sync.errors import EventNotFound, InvalidArgument, RunifoldError, TaskNotFound, WaitTimedOut
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.store.checks import MAX_EVENT_BYTES
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
READER: list[WorkflowStore] = []  # the store a step reads the events through, as a caller would
SEEN: list[Any] = []


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    READER.clear()
    SEEN.clear()
    yield
    READER.clear()
    SEEN.clear()


def run_once(store: WorkflowStore, workflow: Workflow, worker_id: str = "w1") -> Any:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    worker = WorkflowWorker(store, registry, WorkerId.parse(worker_id), LEASE, timedelta(seconds=5))
    try:
        return worker.run_once()
    finally:
        worker.close()


# --- a workflow that reports its stage ---------------------------------------------------

progress = Workflow("progress", 1)


@progress.step()
def pack(ctx: StepContext, order: str) -> str:
    return f"packed {order}"


@progress.step()
def look(ctx: StepContext, packed: str) -> Any:
    """Runs after the resume, when the replay has passed every earlier set_event."""
    return READER[0].get_event(ctx.task_id, "stage")


@progress.main
def progress_main(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    ctx.set_event("stage", "received")
    packed = pack(ctx, order)
    ctx.set_event("stage", "packed")
    ctx.set_event("parcel", {"label": packed, "weights": [1.5, 2], "fragile": None})
    ctx.sleep(timedelta(minutes=5))
    seen = look(ctx, packed)
    ctx.set_event("stage", "shipped")
    return {"seen while resuming": seen}


def test_a_workflow_publishes_events_that_callers_read_last_write_winning(
    backend: Backend, clock: Clock
) -> None:
    store = backend.open()
    READER.append(backend.open())  # another store: what another process would see
    store.enqueue(WorkflowTask.new("progress", 1, "o-1", checkpoint_id="t1"))

    assert isinstance(run_once(store, progress), Suspended)
    assert store.get_event("t1", "stage") == "packed"  # last write wins
    assert store.get_event("t1", "parcel") == {"label": "packed o-1", "weights": [1.5, 2], "fragile": None}
    before = {e.key: e for e in store.published_events("t1")}
    assert list(before) == ["parcel", "stage"]
    assert before["stage"].task_id == "t1" and before["stage"].value == "packed"
    assert before["stage"].set_at <= store.now()

    clock.advance(timedelta(minutes=6))
    outcome = run_once(store, progress, "w2")
    # The resumed run replayed set_event("stage", "received") and ("stage", "packed")
    # before look() ran: neither was written again, so the caller saw the newest value.
    assert outcome == Completed("t1", {"seen while resuming": "packed"})
    after = {e.key: e for e in store.published_events("t1")}
    assert after["stage"].value == "shipped"
    assert after["parcel"] == before["parcel"]  # not rewritten by the replay: same set_at
    assert after["stage"].set_at > before["stage"].set_at


# --- waiting for an event ----------------------------------------------------------------

announce = Workflow("announce", 1)


@announce.main
def announce_main(ctx: WorkflowContext, url: str) -> None:
    ctx.set_event("payment_url", url)
    ctx.sleep(timedelta(days=1))


def test_get_event_with_a_timeout_waits_for_the_event_to_appear(backend: Backend) -> None:
    waiting, store = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("announce", 1, "https://pay/1", checkpoint_id="t1"))
    got: list[Any] = []

    def wait() -> None:
        got.append(waiting.get_event("t1", "payment_url", timeout=timedelta(seconds=30)))
        got.append(time.monotonic())

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # nothing published yet
    assert isinstance(run_once(store, announce), Suspended)
    published_at = time.monotonic()
    thread.join(timeout=10)
    assert got[0] == "https://pay/1"
    assert got[1] - published_at < 0.75  # woken by the commit (PgBouncer without LISTEN polls 0.5 s)
    assert waiting.get_event("t1", "payment_url", timeout=timedelta(0)) == "https://pay/1"


def test_an_event_not_published_is_event_not_found_or_wait_timed_out(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("announce", 1, "https://pay/1", checkpoint_id="t1"))
    with pytest.raises(EventNotFound) as missing:
        store.get_event("t1", "payment_url")
    error = missing.value
    assert (error.task_id, error.key) == ("t1", "payment_url")
    assert isinstance(error, KeyError) and isinstance(error, RunifoldError)
    assert str(error) == "task 't1' has published no event 'payment_url'"  # not KeyError's quoting
    started = time.monotonic()
    with pytest.raises(WaitTimedOut) as late:
        store.get_event("t1", "payment_url", timeout=timedelta(milliseconds=200))
    assert time.monotonic() - started >= 0.2
    assert (late.value.task_id, late.value.key) == ("t1", "payment_url")
    assert str(late.value) == "task 't1' did not publish event 'payment_url' within 0.2 s"
    assert store.published_events("t1") == []


@pytest.mark.parametrize("timeout", [None, timedelta(seconds=30)])
def test_get_event_of_an_unknown_task_is_task_not_found_at_once(
    store: WorkflowStore, timeout: timedelta | None
) -> None:
    started = time.monotonic()
    with pytest.raises(TaskNotFound):
        store.get_event("nope", "stage", timeout=timeout)
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize(
    ("key", "timeout", "field"),
    [
        ("", None, "event key"),
        (" stage", None, "event key"),
        ("x" * 201, None, "event key"),
        (7, None, "event key"),
        ("stage", timedelta(seconds=-1), "get_event timeout"),
        ("stage", 5, "get_event timeout"),
    ],
)
def test_get_event_refuses_a_bad_key_or_timeout_naming_it(
    store: WorkflowStore, key: Any, timeout: Any, field: str
) -> None:
    store.enqueue(WorkflowTask.new("announce", 1, "u", checkpoint_id="t1"))
    with pytest.raises(InvalidArgument, match=field):
        store.get_event("t1", key, timeout=timeout)


# --- what set_event refuses --------------------------------------------------------------

careless = Workflow("careless", 1)


@careless.main
def careless_main(ctx: WorkflowContext, case: str) -> None:
    values: dict[str, tuple[Any, Any]] = {
        "key": ("\tstage", "ok"),
        "not json": ("stage", float("nan")),
        "too large": ("stage", "x" * MAX_EVENT_BYTES),
    }
    key, value = values[case]
    ctx.set_event(key, value)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("key", "event key must be non-empty without surrounding spaces, got '\\tstage'"),
        ("not json", "value of event 'stage' is not JSON-serializable"),
        ("too large", f"value of event 'stage' is {MAX_EVENT_BYTES + 2} bytes encoded, over the limit"),
    ],
)
def test_set_event_refuses_a_bad_key_or_value_and_publishes_nothing(
    store: WorkflowStore, case: str, said: str
) -> None:
    store.enqueue(WorkflowTask.new("careless", 1, case, checkpoint_id="t1"))
    outcome = run_once(store, careless)
    assert isinstance(outcome, Failed)
    assert outcome.error is not None and outcome.error.error_class == "InvalidArgument"
    assert said in outcome.reason
    assert store.published_events("t1") == []


# --- branches ----------------------------------------------------------------------------

branching = Workflow("branching", 1)


@branching.step()
def work(ctx: StepContext, name: str) -> str:
    return f"{name} done"


def _branch(name: str) -> Any:
    def run(ctx: WorkflowContext) -> str:
        done = work(ctx, name)
        ctx.set_event(f"branch {name}", done)
        return done

    return run


@branching.main
def branching_main(ctx: WorkflowContext, _input: None) -> dict[str, Any]:
    return ctx.parallel({"a": _branch("a"), "b": _branch("b")})


def test_parallel_branches_publish_events_of_their_own(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("branching", 1, None, checkpoint_id="t1"))
    assert run_once(store, branching) == Completed("t1", {"a": "a done", "b": "b done"})
    assert {e.key: e.value for e in store.published_events("t1")} == {
        "branch a": "a done",
        "branch b": "b done",
    }
