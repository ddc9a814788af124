"""A worker on each store: durable timers with a deadline, and step outputs that come back
as their annotated types after a real suspend and replay from the stored checkpoint.

Store time is moved with the store's shared clock offset, never by sleeping. Each cycle
after a suspend runs on a new worker, so nothing can come from the first one's memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone, tzinfo
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
from runifold_sync.outcomes import Completed, Failed, FailureDetail, Idle, Suspended
from runifold_sync.store import TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
RAN: list[str] = []  # step bodies that really ran, in order
SEEN: list[tuple[Any, ...]] = []  # what the main function got back from its steps


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    RAN.clear()
    SEEN.clear()
    yield
    RAN.clear()
    SEEN.clear()


def _run_once(store: WorkflowStore, workflow: Workflow, worker_id: str) -> Any:
    """One cycle on a new worker."""
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    worker = WorkflowWorker(store, registry, WorkerId.parse(worker_id), LEASE, timedelta(seconds=5))
    try:
        return worker.run_once()
    finally:
        worker.close()


def _journal(store: WorkflowStore, task_id: str) -> list[tuple[str, str]]:
    checkpoint = read_checkpoint(store, task_id)
    assert checkpoint is not None
    return [(e.call_id, e.status.value) for e in checkpoint.journal]


# --- sleep_until ------------------------------------------------------------------------

until = Workflow("until", 1)


@until.step()
def before(ctx: StepContext) -> str:
    RAN.append("before")
    return "before"


@until.step()
def after(ctx: StepContext, earlier: str) -> str:
    RAN.append("after")
    return f"{earlier}, then after"


@until.main
def until_main(ctx: WorkflowContext, deadline_iso: str) -> str:
    earlier = before(ctx)
    ctx.sleep_until(datetime.fromisoformat(deadline_iso))
    return after(ctx, earlier)


def test_sleep_until_a_future_deadline_suspends_until_store_time_passes_it(
    store: WorkflowStore, clock: Clock
) -> None:
    deadline = store.now() + timedelta(minutes=10, microseconds=123_457)
    store.enqueue(WorkflowTask.new("until", 1, deadline.isoformat(), checkpoint_id="u1"))

    outcome = _run_once(store, until, "w1")
    assert outcome == Suspended("u1", f"waiting for timer timer#1 until {deadline.isoformat()}", deadline)
    waiting = store.get_task("u1")
    assert (waiting.state, waiting.ready_at) == (TaskState.WAITING, deadline)
    assert _journal(store, "u1") == [("before#1", "done"), ("timer#1", "pending")]

    clock.advance(deadline - store.now() - timedelta(seconds=1))  # a second short of it
    assert _run_once(store, until, "w2") == Idle()
    clock.advance(timedelta(seconds=2))  # past it
    assert store.now() > deadline
    assert _run_once(store, until, "w3") == Completed("u1", "before, then after")
    assert RAN == ["before", "after"]  # each body once: before was replayed, not re-run
    assert _journal(store, "u1") == [("before#1", "done"), ("timer#1", "done"), ("after#1", "done")]


naive = Workflow("naive-until", 1)


@naive.main
def naive_main(ctx: WorkflowContext, _input: None) -> str:
    ctx.sleep_until(datetime(2030, 1, 1))  # no timezone: which 2030-01-01 is meant?
    return "slept"


def test_sleep_until_a_naive_datetime_is_refused_with_invalid_argument_naming_it(
    store: WorkflowStore,
) -> None:
    store.enqueue(WorkflowTask.new("naive-until", 1, None, checkpoint_id="n1"))
    reason = (
        "workflow main raised InvalidArgument: sleep_until deadline must be a timezone-aware datetime, "
        "got datetime.datetime(2030, 1, 1, 0, 0)"
    )
    message = "sleep_until deadline must be a timezone-aware datetime, got " + repr(datetime(2030, 1, 1))
    error = FailureDetail("InvalidArgument", message, "n1")
    assert _run_once(store, naive, "w1") == Failed(
        "n1", reason, recoverable=False, cause="workflow_error", error=error
    )
    assert store.get_task("n1").state is TaskState.TERMINAL


class _NoOffset(tzinfo):
    """A tzinfo that is set but gives no offset: the datetime is naive in all but name."""

    def utcoffset(self, dt: datetime | None) -> None:
        return None


FAR_FUTURE = datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-14)))  # year 10000 in UTC


@pytest.mark.parametrize(
    ("deadline", "message"),
    [
        (
            FAR_FUTURE,
            "sleep_until deadline must be from 0001-01-02T00:00:00+00:00 to "
            f"9999-12-30T23:59:59.999999+00:00 in UTC, got {FAR_FUTURE!r}",
        ),
        (
            datetime(2030, 1, 1, tzinfo=_NoOffset()),
            "sleep_until deadline must be a timezone-aware datetime, got datetime.datetime(2030, 1, 1, 0, 0, "
            "tzinfo=<",
        ),
    ],
    ids=["past-datetime-range-in-utc", "utcoffset-none"],
)
def test_sleep_until_a_deadline_no_store_could_hold_fails_the_task_naming_it(
    store: WorkflowStore, deadline: datetime, message: str
) -> None:
    # Before: "ValueError: year 10000 is out of range", or a bare TypeError.
    until = Workflow("far-until", 1)

    @until.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        ctx.sleep_until(deadline)
        return "slept"

    store.enqueue(WorkflowTask.new("far-until", 1, None, checkpoint_id="f1"))
    outcome = _run_once(store, until, "w1")

    assert isinstance(outcome, Failed), outcome
    assert outcome.cause == "workflow_error"
    assert outcome.reason.startswith(f"workflow main raised InvalidArgument: {message}")
    assert store.get_task("f1").state is TaskState.TERMINAL
    assert _run_once(store, until, "w2") == Idle()


# --- typed step outputs across a replay -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Parcel:
    sku: str
    weight_g: int
    tags: tuple[str, ...]


typed = Workflow("typed", 1)


@typed.step()
def pack(ctx: StepContext, order: str) -> Parcel:
    RAN.append("pack")
    return Parcel(f"sku-{order}", 1250, ("fragile", "upright"))


@typed.step()
def plan_bins(ctx: StepContext, order: str) -> dict[str, tuple[int, ...]]:
    RAN.append("plan_bins")
    return {"front": (1, 2), "back": (3,), "spare": ()}


@typed.main
def typed_main(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    parcel = pack(ctx, order)
    bins = plan_bins(ctx, order)
    SEEN.append((parcel, bins))
    ctx.sleep(timedelta(seconds=60))
    return {"sku": parcel.sku, "bins": sorted(bins)}


def test_dataclass_and_container_outputs_come_back_as_their_annotated_types_after_replay(
    store: WorkflowStore, clock: Clock
) -> None:
    store.enqueue(WorkflowTask.new("typed", 1, "o7", checkpoint_id="t1"))
    assert isinstance(_run_once(store, typed, "w1"), Suspended)
    clock.advance(timedelta(seconds=61))
    assert _run_once(store, typed, "w2") == Completed(
        "t1", {"sku": "sku-o7", "bins": ["back", "front", "spare"]}
    )
    assert RAN == ["pack", "plan_bins"]  # the second cycle replayed both

    expected_parcel = Parcel("sku-o7", 1250, ("fragile", "upright"))
    expected_bins = {"front": (1, 2), "back": (3,), "spare": ()}
    live, replayed = SEEN
    for parcel, bins in (live, replayed):
        assert type(parcel) is Parcel and parcel == expected_parcel
        assert type(parcel.tags) is tuple
        assert type(bins) is dict and bins == expected_bins  # (1, 2) != [1, 2]: tuples came back
        assert all(type(v) is tuple for v in bins.values())
    # The checkpoint itself holds plain JSON, so the types came from the annotations.
    journal = entries(store, "t1")
    assert [e["output"] for e in journal[:2]] == [
        {"sku": "sku-o7", "weight_g": 1250, "tags": ["fragile", "upright"]},
        {"front": [1, 2], "back": [3], "spare": []},
    ]
