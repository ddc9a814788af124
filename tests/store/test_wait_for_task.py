"""``store.wait_for_task`` on every backend: it returns the record once the task has
finished, by each transition that finishes one, raises ``WaitTimedOut`` when the timeout
passes first and ``TaskNotFound`` at once for an unknown id, and a waiter blocked on one
store is woken by a commit made through another store on the same database (another
"process": its own connections) well under a second after it.

Each transition is made with the store's own operations, as a worker or an operator
makes it, so every path that ends a task is shown to wake a waiter.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import (
    InvalidArgument,
    RunifoldError,
    StoreUsedAcrossFork,
    TaskNotFound,
    WaitTimedOut,
)
from runifold_sync.store import TaskOutcome, TaskRecord, TaskState
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
WORKER = WorkerId.parse("w1")
WAKE_LIMIT_S = 0.75  # "well under a second": PgBouncer without LISTEN polls every 0.5 s


@attrs.define
class Waiter:
    """``wait_for_task`` on a thread of its own: what it returned or raised, and when."""

    thread: threading.Thread
    outcome: list[Any] = attrs.Factory(list)
    returned_at: list[float] = attrs.Factory(list)

    def result(self) -> Any:
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the waiter never returned"
        return self.outcome[0]


def wait_in_thread(store: WorkflowStore, task_id: str, timeout: timedelta) -> Waiter:
    waiter = Waiter(threading.Thread(target=lambda: None))

    def run() -> None:
        try:
            waiter.outcome.append(store.wait_for_task(task_id, timeout))
        except RunifoldError as exc:
            waiter.outcome.append(exc)
        waiter.returned_at.append(time.monotonic())

    waiter.thread = threading.Thread(target=run, daemon=True)
    waiter.thread.start()
    return waiter


def enqueue(store: WorkflowStore, task_id: str = "t1") -> None:
    store.enqueue(WorkflowTask.new("orders", 1, {"order": task_id}, checkpoint_id=task_id))


def complete(store: WorkflowStore) -> None:
    [claimed] = store.claim(WORKER, LEASE)
    store.complete(claimed.lease, claimed.revision, "{}", '{"shipped": true}')


def fail(store: WorkflowStore) -> None:
    [claimed] = store.claim(WORKER, LEASE)
    store.fail(claimed.lease, claimed.revision, None, reason="the card was declined")


def acknowledge_cancel(store: WorkflowStore) -> None:
    [claimed] = store.claim(WORKER, LEASE)
    assert store.cancel("t1", "alice", "not wanted") is TaskState.LEASED
    store.acknowledge_cancel(claimed.lease, claimed.revision, "{}")


def cancel_queued(store: WorkflowStore) -> None:
    assert store.cancel("t1", "alice", "not wanted") is TaskState.CANCELLED


FINISHES: dict[str, tuple[Callable[[WorkflowStore], None], TaskState, TaskOutcome | None]] = {
    "complete": (complete, TaskState.TERMINAL, TaskOutcome.COMPLETED),
    "fail": (fail, TaskState.TERMINAL, TaskOutcome.FAILED),
    "acknowledge_cancel": (acknowledge_cancel, TaskState.CANCELLED, None),
    "cancel_queued": (cancel_queued, TaskState.CANCELLED, None),
}


@pytest.mark.parametrize("finish", list(FINISHES))
def test_a_waiter_is_woken_by_each_transition_that_finishes_a_task_made_through_another_store(
    backend: Backend, finish: str
) -> None:
    make, state, outcome = FINISHES[finish]
    waiting, other = backend.open(), backend.open()
    enqueue(waiting)
    waiter = wait_in_thread(waiting, "t1", timedelta(seconds=30))
    time.sleep(0.3)  # blocked in its wait, past its first reads
    assert waiter.thread.is_alive()
    make(other)
    finished_at = time.monotonic()
    record = waiter.result()
    assert isinstance(record, TaskRecord), record
    assert (record.task_id, record.state, record.outcome) == ("t1", state, outcome)
    assert waiter.returned_at[0] - finished_at < WAKE_LIMIT_S
    if outcome is TaskOutcome.COMPLETED:
        assert record.result == {"shipped": True}


def test_a_finished_task_is_returned_at_once(store: WorkflowStore) -> None:
    enqueue(store)
    complete(store)
    started = time.monotonic()
    record = store.wait_for_task("t1", timedelta(seconds=30))
    assert (record.state, record.outcome, record.result) == (
        TaskState.TERMINAL,
        TaskOutcome.COMPLETED,
        {"shipped": True},
    )
    assert time.monotonic() - started < 0.5
    assert store.wait_for_task("t1", timedelta(0)) == record  # a zero timeout looks once


@pytest.mark.parametrize("state", ["queued", "leased", "waiting"])
def test_an_unfinished_task_times_out_with_wait_timed_out(store: WorkflowStore, state: str) -> None:
    enqueue(store)
    if state != "queued":
        [claimed] = store.claim(WORKER, LEASE)
    if state == "waiting":
        store.suspend(claimed.lease, claimed.revision, "{}", wake_at=None, reason="a signal", signal="go")
    started = time.monotonic()
    with pytest.raises(WaitTimedOut) as caught:
        store.wait_for_task("t1", timedelta(milliseconds=300))
    assert time.monotonic() - started >= 0.3
    error = caught.value
    assert (error.task_id, error.timeout, error.key) == ("t1", timedelta(milliseconds=300), None)
    assert isinstance(error, TimeoutError) and isinstance(error, RunifoldError)
    assert str(error) == "task 't1' did not finish within 0.3 s"
    with pytest.raises(WaitTimedOut):
        store.wait_for_task("t1", timedelta(0))
    assert store.get_task("t1").state.value == state


def test_an_unknown_task_is_task_not_found_at_once(store: WorkflowStore) -> None:
    started = time.monotonic()
    with pytest.raises(TaskNotFound) as caught:
        store.wait_for_task("nope", timedelta(seconds=30))
    assert caught.value.task_id == "nope"
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize(
    ("timeout", "shown"),
    [
        (timedelta(seconds=-1), "days=-1, seconds=86399"),
        (30, "30"),
        (None, "None"),
        (timedelta(days=3651), "3651"),
    ],
)
def test_a_bad_timeout_is_invalid_argument_naming_it(store: WorkflowStore, timeout: Any, shown: str) -> None:
    enqueue(store)
    with pytest.raises(InvalidArgument, match="wait_for_task timeout") as caught:
        store.wait_for_task("t1", timeout)
    assert shown in str(caught.value)


def test_a_bad_task_id_is_invalid_argument(store: WorkflowStore) -> None:
    with pytest.raises(InvalidArgument, match="task id"):
        store.wait_for_task(42, timedelta(seconds=1))  # type: ignore[arg-type]


def test_many_waiters_on_one_store_each_return_their_own_task(backend: Backend) -> None:
    waiting, other = backend.open(), backend.open()
    ids = [f"t{n}" for n in range(12)]
    for task_id in ids:
        enqueue(waiting, task_id)
    waiters = {task_id: wait_in_thread(waiting, task_id, timedelta(seconds=30)) for task_id in ids}
    time.sleep(0.3)
    for _ in ids:  # claimed in enqueue order, so the first waiters are woken first
        complete(other)
    for task_id, waiter in waiters.items():
        record = waiter.result()
        assert isinstance(record, TaskRecord), record
        assert (record.task_id, record.outcome) == (task_id, TaskOutcome.COMPLETED)


def test_a_wait_in_a_forked_child_is_store_used_across_fork(store: WorkflowStore) -> None:
    enqueue(store)
    with pytest.raises(WaitTimedOut):  # the parent has waited: on PostgreSQL its listener runs
        store.wait_for_task("t1", timedelta(milliseconds=50))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 2
        try:
            store.wait_for_task("t1", timedelta(seconds=5))
        except StoreUsedAcrossFork as exc:
            os.write(write, str(exc).encode())
            code = 0
        except BaseException as exc:
            os.write(write, repr(exc).encode())
        finally:
            store.close()  # must not touch the parent's connections or thread
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert "fork" in message
    complete(store)
    assert store.wait_for_task("t1", timedelta(seconds=5)).outcome is TaskOutcome.COMPLETED
