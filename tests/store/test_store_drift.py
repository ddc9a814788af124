"""Both backends answer the same condition with the same error class.

The two stores share one implementation of every operation, and these tests pin the
places where they once drifted apart: a clock offset that is not a timedelta, task ids,
pids and reasons of the wrong type, and a store used from a forked child (SQLite refused
a new thread of the child as an outage, ``StoreUnavailable``, which workers retry; it is
a programming error everywhere).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument
from runifold_sync.store.records import Lease
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")


def _claimed(store: WorkflowStore) -> tuple[Lease, int]:
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    [claimed] = store.claim(W1, LEASE)
    return claimed.lease, claimed.revision


ODD_TASK_IDS = [5, None, b"t1", ["t1"]]


@pytest.mark.parametrize("task_id", ODD_TASK_IDS)
def test_a_task_id_that_is_not_a_string_is_invalid_on_every_read_and_action(
    store: WorkflowStore, task_id: Any
) -> None:
    """PostgreSQL used to answer these with StoreUnavailable (an operator mismatch),
    which workers retry as an outage; SQLite answered as for an unknown task."""
    calls: list[Callable[[], object]] = [
        lambda: store.get_task(task_id),
        lambda: store.history(task_id),
        lambda: store.read_journal(task_id),
        lambda: store.journal_tail(task_id, 5),
        lambda: store.pending_signals(task_id),
        lambda: store.cancel(task_id, "ops", "why"),
        lambda: store.requeue(task_id, actor="ops", reason="why"),
        lambda: store.resolve_effect(task_id, "k", applied=True, result_json=None, actor="ops", reason="why"),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument, match=re.escape(f"task id must be a string, got {task_id!r}")):
            call()


@pytest.mark.parametrize("pid", ["x", 0, 1.5, None])
def test_a_worker_pid_that_is_not_a_positive_integer_is_invalid(store: WorkflowStore, pid: Any) -> None:
    for call in (
        lambda: store.register_worker(W1, host="h", pid=pid, definitions=[]),
        lambda: store.worker_seen(W1, pid),
        lambda: store.worker_stopped(W1, pid),
    ):
        with pytest.raises(InvalidArgument, match=f"pid must be an integer >= 1, got {pid!r}"):
            call()


@pytest.mark.parametrize("reason", [None, 5])
def test_a_reason_that_is_not_a_string_is_invalid_and_the_lease_still_holds(
    store: WorkflowStore, reason: Any
) -> None:
    lease, revision = _claimed(store)
    for call in (
        lambda: store.fail(lease, revision, None, reason=reason),
        lambda: store.retry(lease, revision, "{}", delay=timedelta(0), reason=reason),
        lambda: store.suspend(lease, revision, "{}", wake_at=None, reason=reason),
        lambda: store.release(lease, delay=timedelta(0), reason=reason),
    ):
        with pytest.raises(InvalidArgument, match=f"reason must be a string, got {reason!r}"):
            call()
    assert store.commit_checkpoint(lease, revision, "{}").revision == revision + 1


@pytest.mark.parametrize("offset", [5, 5.0, None, "5s"])
def test_a_clock_offset_that_is_not_a_timedelta_is_invalid(store: WorkflowStore, offset: Any) -> None:
    with pytest.raises(InvalidArgument, match="clock offset must be a datetime.timedelta"):
        store.set_clock_offset(offset)
    assert abs(store.now() - datetime.now(store.now().tzinfo)) < timedelta(minutes=1)  # unchanged


def test_a_naive_wake_time_is_invalid_and_the_lease_still_holds(store: WorkflowStore) -> None:
    lease, revision = _claimed(store)
    with pytest.raises(InvalidArgument, match="wake_at must be a timezone-aware datetime"):
        store.suspend(lease, revision, "{}", wake_at=datetime(2030, 1, 1), reason="later")  # noqa: DTZ001
    # one no store could read back (past year 9999 in UTC) is refused the same way
    past = datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-14)))
    with pytest.raises(InvalidArgument, match="wake_at must be from 0001-01-02"):
        store.suspend(lease, revision, "{}", wake_at=past, reason="later")
    assert store.commit_checkpoint(lease, revision, "{}").revision == revision + 1


@pytest.mark.parametrize("delay", [5, None])
def test_a_delay_that_is_not_a_timedelta_is_invalid(store: WorkflowStore, delay: Any) -> None:
    lease, revision = _claimed(store)
    with pytest.raises(InvalidArgument, match="delay must be a datetime.timedelta"):
        store.retry(lease, revision, "{}", delay=delay, reason="again")
    with pytest.raises(InvalidArgument, match="delay must be a datetime.timedelta"):
        store.release(lease, delay=delay, reason="again")
    assert store.commit_checkpoint(lease, revision, "{}").revision == revision + 1


# Every kind of use: reads, producer and operator writes, the worker's writes, waiting.
USES: dict[str, Callable[[WorkflowStore, Lease], object]] = {
    "get_task": lambda s, _: s.get_task("t1"),
    "list_tasks": lambda s, _: s.list_tasks(),
    "history": lambda s, _: s.history("t1"),
    "now": lambda s, _: s.now(),
    "enqueue": lambda s, _: s.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t2")),
    "send_signal": lambda s, _: s.send_signal("t1", "go", {}, signal_id="s1", sender="test"),
    "cancel": lambda s, _: s.cancel("t1", "ops", "why"),
    "claim": lambda s, _: s.claim(W1, LEASE),
    "heartbeat": lambda s, lease: s.heartbeat(lease, LEASE),
    "commit_checkpoint": lambda s, lease: s.commit_checkpoint(lease, 1, "{}"),
    "complete": lambda s, lease: s.complete(lease, 1, "{}", "null"),
    "set_clock_offset": lambda s, _: s.set_clock_offset(timedelta(0)),
    "wait_for_work": lambda s, _: s.wait_for_work(timedelta(0)),
    "migrate": lambda s, _: s.migrate(),
}


def _in_child(store: WorkflowStore, lease: Lease, *, new_thread: bool) -> list[str]:
    """Try every use in a forked child (on its main thread or a new one); returns what
    each raised, as ``use: ErrorClass``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            answers: list[str] = []

            def try_all() -> None:
                for name, use in USES.items():
                    try:
                        use(store, lease)
                        answers.append(f"{name}: no error")
                    except BaseException as exc:  # reported to the parent
                        answers.append(f"{name}: {type(exc).__name__}")

            if new_thread:
                thread = threading.Thread(target=try_all)
                thread.start()
                thread.join()
            else:
                try_all()
            os.write(write, "\n".join(answers).encode())
        except BaseException as exc:
            os.write(write, repr(exc).encode())
            code = 2
        finally:
            store.close()  # must not touch the parent's connections
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report.splitlines()


@pytest.mark.parametrize("new_thread", [False, True], ids=["main-thread", "new-thread"])
def test_every_use_of_a_store_in_a_forked_child_raises_store_used_across_fork(
    store: WorkflowStore, new_thread: bool
) -> None:
    lease, revision = _claimed(store)
    answers = _in_child(store, lease, new_thread=new_thread)
    assert answers == [f"{name}: StoreUsedAcrossFork" for name in USES]
    # The parent's store is untouched and still holds the lease.
    assert store.get_task("t1").worker_id == W1.value
    assert store.commit_checkpoint(lease, revision, "{}").revision == revision + 1
