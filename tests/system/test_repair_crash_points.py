"""The crash-point cases of the repairs: the operator's process (``python -m
runifold_sync fork|resume|retry|cancel|upgrade``) killed with SIGKILL inside each
repair's transaction (``within_operator``: nothing of it is stored) and just after its
commit (``after_operator``: all of it is), on every backend. Then the same command run
again finishes the job, and the tasks run: each fork made once, each task requeued,
cancelled or moved once (one audit event each), the effects before a fork point run once
in all."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta

import attrs
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, WorkflowWorker
from runifold_sync.errors import TaskNotFound
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.store import TaskState
from tests.cli import test_repair_cli
from tests.store import test_repairs
from tests.support import processes
from tests.support.backends import Backend

pytestmark = pytest.mark.timeout(120)
AUDIT = ["--actor", "ops", "--reason", "crash drill"]
APP = "tests.cli.test_repair_cli:registry"


@attrs.frozen
class RepairCase:
    crash: str  # RUNIFOLD_CRASH_AT of the operator's process
    stored: bool  # the repair's transaction committed before it died


REPAIR_CASES = {
    f"{point}:{operation}": RepairCase(f"{point}:{operation}", stored=point == "after_operator")
    for point in ("within_operator", "after_operator")
    for operation in ("fork", "resume_cancelled", "retry_batch", "cancel_batch", "upgrade")
}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    test_repairs.RAN.clear()
    test_repairs.FLAGS.clear()
    yield
    test_repairs.RAN.clear()
    test_repairs.FLAGS.clear()


def worker(store: WorkflowStore) -> WorkflowWorker:
    return WorkflowWorker(
        store, test_repair_cli.registry, WorkerId.parse("drill"), LeaseDuration(timedelta(seconds=30))
    )


def killed(backend: Backend, crash: str, *command: str) -> None:
    env = dict(os.environ, RUNIFOLD_CRASH_AT=crash)
    proc = processes.run("runifold_sync", *command, "--database", backend.url, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {crash} reached" in proc.stderr, proc.stderr


def again(backend: Backend, *command: str) -> str:
    proc = processes.run("runifold_sync", *command, "--database", backend.url, timeout_s=60)
    assert proc.returncode in (0, 1), (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def events(store: WorkflowStore, task_id: str, kind: str) -> int:
    return sum(1 for e in store.history(task_id) if e.kind == kind)


def drill_fork(backend: Backend, store: WorkflowStore, case: RepairCase) -> None:
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="orig"))
    w = worker(store)
    assert w.run_once() == Completed("orig", 5)
    command = ["fork", "orig", "--from-step", "s3", "--task-id", "orig-f", *AUDIT]
    killed(backend, case.crash, *command)
    if case.stored:
        assert store.get_task("orig-f").state is TaskState.QUEUED
    else:
        with pytest.raises(TaskNotFound):
            store.get_task("orig-f")
        assert events(store, "orig", "forked") == 0
        again(backend, *command)
    assert w.run_once() == Completed("orig-f", 5)
    w.close()
    assert events(store, "orig", "forked") == 1 and events(store, "orig-f", "forked_from") == 1
    ran = test_repairs.RAN
    assert sum(n for (_t, c), n in ran.items() if c == "s1") == 1  # the effect before the fork: once in all
    assert ran[("orig-f", "s3")] == 1


def drill_resume(backend: Backend, store: WorkflowStore, case: RepairCase) -> None:
    store.enqueue(WorkflowTask.new("trip", 1, 4, checkpoint_id="t"))
    w = worker(store)
    assert isinstance(w.run_once(), Suspended)
    store.cancel("t", "ops", "by mistake")
    killed(backend, case.crash, "resume", "t", *AUDIT)
    assert store.get_task("t").state is (TaskState.QUEUED if case.stored else TaskState.CANCELLED)
    if not case.stored:
        again(backend, "resume", "t", *AUDIT)
    store.send_signal("t", "go", None, signal_id="go-t", sender="ops")
    while store.get_task("t").state is not TaskState.TERMINAL:
        w.run_once()
    w.close()
    assert store.get_task("t").result == "paid 4 under v1" and events(store, "t", "resumed") == 1


def drill_batch(backend: Backend, store: WorkflowStore, case: RepairCase, action: str) -> None:
    ids = [f"b{n}" for n in range(5)]
    if action == "retry":
        test_repairs.FLAGS["fail_s5"] = True
    else:
        test_repairs.FLAGS["wait"] = True
    store.enqueue_many([WorkflowTask.new("five", 1, n, checkpoint_id=t) for n, t in enumerate(ids)])
    w = worker(store)
    for _ in ids:
        assert isinstance(w.run_once(), Failed if action == "retry" else Suspended)
    command = [action, "--definition", "five", "--batch", "2", *AUDIT]
    killed(backend, case.crash, *command)
    kind = "requeued" if action == "retry" else "cancelled"
    assert sum(events(store, t, kind) for t in ids) == (2 if case.stored else 0)  # a batch is whole
    again(backend, *command)
    assert [events(store, t, kind) for t in ids] == [1] * 5  # each audited once, none twice
    if action == "retry":
        test_repairs.FLAGS.clear()
        for _ in ids:
            assert isinstance(w.run_once(), Completed)
    w.close()
    final = TaskState.TERMINAL if action == "retry" else TaskState.CANCELLED
    assert [store.get_task(t).state for t in ids] == [final] * 5


def drill_upgrade(backend: Backend, store: WorkflowStore, case: RepairCase) -> None:
    store.enqueue(WorkflowTask.new("trip", 1, 3, checkpoint_id="u"))
    w = worker(store)
    assert isinstance(w.run_once(), Suspended)
    command = ["upgrade", "trip", "--from", "1", "--to", "2", "--app", APP, *AUDIT]
    killed(backend, case.crash, *command)
    assert store.get_task("u").definition_version == (2 if case.stored else 1)
    again(backend, *command)
    assert store.get_task("u").definition_version == 2 and events(store, "u", "upgraded") == 1
    store.send_signal("u", "go", None, signal_id="go-u", sender="ops")
    assert w.run_once() == Completed("u", "paid 3 under v2")
    w.close()


DRILLS: dict[str, Callable[[Backend, WorkflowStore, RepairCase], None]] = {
    "fork": drill_fork,
    "resume_cancelled": drill_resume,
    "retry_batch": lambda b, s, c: drill_batch(b, s, c, "retry"),
    "cancel_batch": lambda b, s, c: drill_batch(b, s, c, "cancel"),
    "upgrade": drill_upgrade,
}


@pytest.mark.parametrize("name", list(REPAIR_CASES))
def test_repair_crash_point(name: str, backend: Backend) -> None:
    case = REPAIR_CASES[name]
    store = backend.open()
    try:
        DRILLS[case.crash.partition(":")[2]](backend, store, case)
    finally:
        store.close()
