"""``WorkflowWorker.run``, the worker loop, in this process on both stores: it stops on
its token after the cycle in flight, stops after ``max_tasks`` tasks (how a pool
recycles), chains each next claim onto a completion, wakes from an idle wait when work
arrives, hands back tasks it claimed ahead, and survives a failed cycle."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    StepContext,
    WorkerId,
    WorkerReport,
    WorkerSettings,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument, StoreUnavailable
from runifold_sync.outcomes import RunOutcome
from runifold_sync.store import TaskState
from tests.support.backends import Backend

LEASE = LeaseDuration(timedelta(seconds=5))
HEARTBEAT = timedelta(seconds=1)
QUICK = {"min_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=50)}
flow = Workflow("run-loop", 1)

# The step of the task whose input is STOP["at"] cancels STOP["token"]: a stop that comes
# while a cycle is in flight, as a SIGTERM during a step would.
STOP: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _no_stop() -> Iterator[None]:
    STOP.clear()
    yield
    STOP.clear()


@flow.step()
def work(ctx: StepContext, n: int) -> int:
    if STOP.get("at") == n:
        STOP["token"].cancel()
    return n + 1


@flow.step()
def finish(ctx: StepContext, n: int) -> int:
    return n * 10


@flow.main
def main(ctx: WorkflowContext, n: int) -> int:
    return finish(ctx, work(ctx, n))


def _worker(store: WorkflowStore, **options: Any) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    settings = WorkerSettings(LEASE, HEARTBEAT, **options)
    return WorkflowWorker(store, registry, WorkerId.parse("looper"), settings=settings)


def _run(store: WorkflowStore, token: CancellationToken | None = None, **options: Any) -> WorkerReport:
    """Run a new worker's loop (``options``: its ``max_tasks`` and ``on_outcome``, the
    rest its settings) with a short idle backoff, then close it."""
    loop = {k: options.pop(k) for k in ("max_tasks", "on_outcome") if k in options}
    worker = _worker(store, **options)
    try:
        return worker.run(token or CancellationToken(), **loop, **QUICK)
    finally:
        worker.close()


def _enqueue(store: WorkflowStore, count: int, prefix: str = "r") -> list[str]:
    ids = [f"{prefix}{n}" for n in range(count)]
    store.enqueue_many([WorkflowTask.new("run-loop", 1, n, checkpoint_id=i) for n, i in enumerate(ids)])
    return ids


def _stop_at(n: int) -> CancellationToken:
    token = CancellationToken()
    STOP.update(at=n, token=token)
    return token


def _count_claims(store: WorkflowStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the worker's own claims (``claims[0]``); a task claimed by a completion, in
    the completion's transaction, is not one of them."""
    claims = [0]
    real_claim = store.claim

    def claim(*args: Any, **kwargs: Any) -> Any:
        claims[0] += 1
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim", claim)
    return claims


def test_run_finishes_the_cycle_in_flight_when_its_token_is_cancelled_and_claims_nothing_more(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = backend.open()
    ids = _enqueue(store, 4)
    claims = _count_claims(store, monkeypatch)
    token = _stop_at(1)  # cancelled inside task r1's first step
    heard: list[RunOutcome] = []
    report = _run(store, token, on_outcome=heard.append)
    assert report == WorkerReport({"completed": 2}, tasks=2, reached_max_tasks=False)
    assert [o.kind for o in heard] == ["completed", "completed"]
    assert [store.get_task(i).result for i in ids[:2]] == [10, 20]
    assert claims == [1]  # r1 was claimed by r0's completion
    # r1 completed after the cancel, so its completion claimed no next task.
    assert [store.get_task(i).state for i in ids[2:]] == [TaskState.QUEUED] * 2
    assert [e.kind for e in store.history("r2")] == ["enqueued"]


def test_run_stops_after_max_tasks_with_no_task_claimed_beyond_them(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = backend.open()
    ids = _enqueue(store, 5)
    claims = _count_claims(store, monkeypatch)
    report = _run(store, max_tasks=3)
    assert report == WorkerReport({"completed": 3}, tasks=3, reached_max_tasks=True)
    assert [store.get_task(i).state for i in ids] == [TaskState.TERMINAL] * 3 + [TaskState.QUEUED] * 2
    assert claims == [1]  # r1 and r2 were claimed by the completions before them
    # The last task's completion claimed nothing: the loop was about to end.
    assert [e.kind for e in store.history("r3")] == ["enqueued"]


def test_a_yielded_cycle_does_not_count_towards_max_tasks(backend: Backend) -> None:
    store = backend.open()
    _enqueue(store, 1)
    report = _run(store, max_tasks=1, max_steps_per_claim=1)  # it yields once, after its first step
    assert report == WorkerReport({"yielded": 1, "completed": 1}, tasks=1, reached_max_tasks=True)
    assert store.get_task("r0").result == 10


def test_a_stopped_run_hands_back_the_tasks_it_claimed_ahead(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, 4)
    token = _stop_at(0)
    worker = _worker(store, claim_batch=3)
    try:
        report = worker.run(token, **QUICK)
        # Handed back when run returned, not only when the worker is closed.
        for task_id in ids[1:3]:
            record = store.get_task(task_id)
            assert (record.state, record.claims_since_progress) == (TaskState.QUEUED, 0)
            assert [e.kind for e in store.history(task_id)] == ["enqueued", "claimed", "released"]
    finally:
        worker.close()
    assert report == WorkerReport({"completed": 1}, tasks=1, reached_max_tasks=False)
    assert [e.kind for e in store.history(ids[3])] == ["enqueued"]


@pytest.mark.timeout(60)
def test_an_idle_run_starts_new_work_within_a_wait_slice_and_stops_within_one(backend: Backend) -> None:
    """Every idle wait is 5 s here, so a start (or a stop) sooner than that came from the
    store's ``wait_for_work`` waking (a NOTIFY, or SQLite's poll) or from the token being
    checked between wait slices (0.5 s)."""
    store, other = backend.open(), backend.open()
    token = CancellationToken()
    worker = _worker(store)
    reports: list[WorkerReport] = []
    loop = threading.Thread(
        target=lambda: reports.append(
            worker.run(token, min_backoff=timedelta(seconds=5), max_backoff=timedelta(seconds=5))
        )
    )
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while not other.workers() and time.monotonic() < deadline:
            time.sleep(0.02)  # registered on its first (empty) claim
        time.sleep(0.3)  # well inside its first idle wait
        enqueued_at = time.monotonic()
        [task_id] = _enqueue(other, 1, prefix="late")
        while other.get_task(task_id).state is not TaskState.TERMINAL and time.monotonic() < deadline:
            time.sleep(0.01)
        started_s = time.monotonic() - enqueued_at
        time.sleep(0.3)  # idle again
        stopped_at = time.monotonic()
        token.cancel()
        loop.join(10)
        stopped_s = time.monotonic() - stopped_at
    finally:
        token.cancel()
        loop.join(10)
        worker.close()
    assert other.get_task(task_id).result == 10
    assert started_s < 2.5, started_s
    assert stopped_s < 2.5, stopped_s
    [report] = reports
    assert report.outcomes["completed"] == 1 and report.outcomes["idle"] >= 2


def test_a_failed_cycle_is_retried_after_the_backoff_without_ending_the_run(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = backend.open()
    _enqueue(store, 1)
    real_claim = store.claim
    failures = [StoreUnavailable("simulated restart")]

    def claim(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim", claim)
    report = _run(store, max_tasks=1)
    assert report == WorkerReport({"completed": 1}, tasks=1, reached_max_tasks=True)
    assert failures == []


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_tasks_must_be_a_positive_integer(sqlite_store: WorkflowStore, bad: Any) -> None:
    worker = _worker(sqlite_store)
    try:
        with pytest.raises(InvalidArgument, match=f"max_tasks must be an integer >= 1, got {bad!r}"):
            worker.run(CancellationToken(), max_tasks=bad)
    finally:
        worker.close()


def test_a_worker_hands_back_what_a_claim_whose_answer_it_lost_had_leased(backend: Backend) -> None:
    """A claim whose connection dropped after it committed leased a task its worker never
    heard of. The store marks the worker's claims in doubt when a claim fails for an
    outage; before it claims again the worker hands back the leases it holds but does
    not know of, so the task runs at once rather than once its lease (5 s) runs out."""
    store = backend.open()
    store.enqueue(WorkflowTask.new("run-loop", 1, 1, checkpoint_id="lost"))
    store.claim(WorkerId.parse("looper"), LEASE)  # the claim whose answer never came back
    store.claims_in_doubt.add("looper")  # as a claim that failed for an outage leaves it
    began = time.monotonic()
    report = _run(store, max_tasks=1)
    assert time.monotonic() - began < LEASE.seconds, "the task waited for its lost lease to run out"
    assert report.outcomes == {"completed": 1}
    history = store.history("lost")
    assert [(e.kind, e.worker_id) for e in history] == [
        ("enqueued", None),
        ("claimed", "looper"),
        ("released", "looper"),
        ("claimed", "looper"),
        ("completed", "looper"),
    ]
    assert history[2].detail["reason"].endswith("the answer to its claim was lost with the connection")
    assert store.get_task("lost").claims_since_progress == 0
    assert store.claims_in_doubt == set()
