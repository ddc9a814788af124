"""Using across a fork what must not cross one raises a RunifoldError naming the
condition (``ForkUnsafe``, ``StoreUsedAcrossFork``), never a bare RuntimeError: a worker's
heartbeat built in one process and started in a child of it, and a store opened in one
process and used in a child."""

from __future__ import annotations

import os
from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId
from runifold_sync.errors import ForkUnsafe, RunifoldError, StoreUsedAcrossFork
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.worker.heartbeat import LeaseKeeper


def _in_a_child(act: object) -> str:
    """The class name of what ``act()`` raised in a forked child ("" for nothing)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports over the pipe and never returns into pytest
        raised = ""
        try:
            act()  # type: ignore[operator]
        except BaseException as exc:
            raised = ",".join(c.__name__ for c in type(exc).__mro__)
        finally:
            os.write(write_fd, raised.encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        raised = pipe.read().decode()
    os.waitpid(pid, 0)
    return raised


def test_a_heartbeat_started_in_a_child_of_the_process_that_built_it_raises_fork_unsafe(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    keeper = LeaseKeeper(sqlite_store, LeaseDuration(timedelta(seconds=30)), 10.0, "runifold-heartbeat-t")
    raised = _in_a_child(lambda: keeper.announce(WorkerId.parse("w1")))
    assert raised.split(",")[:2] == [ForkUnsafe.__name__, RunifoldError.__name__]
    keeper.close()


def test_a_store_used_in_a_child_of_the_process_that_opened_it_raises_store_used_across_fork(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    raised = _in_a_child(lambda: sqlite_store.get_task("t1"))
    assert raised.split(",")[0] == StoreUsedAcrossFork.__name__ and RunifoldError.__name__ in raised
