"""Running a pool from Python: ``WorkflowSupervisor.run`` refuses to fork beside an open
store or a running worker (``ForkUnsafe``), refuses a ``base_id`` whose worker ids are
live in another pool (``WorkerIdInUse``, as the CLI's preflight does), and the
per-outcome hook a pool's workers take (``CycleObserver``) is exported and documented."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import runifold_sync
from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    WorkerId,
    WorkflowSupervisor,
    WorkflowSupervisorConfig,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.errors import RunifoldError, WorkerIdInUse
from runifold_sync.store import TaskState
from tests.support import processes

from . import pool_app

LEASE = LeaseDuration(timedelta(seconds=5))


def _factory(url: str) -> object:
    def factory(worker_id: WorkerId) -> WorkflowWorker:  # in the child
        return WorkflowWorker(open_store(url), pool_app.registry(), worker_id, LEASE, timedelta(seconds=1))

    return factory


def _run_briefly(supervisor: WorkflowSupervisor, seconds: float = 1.0) -> runifold_sync.SupervisorReport:
    token = CancellationToken()
    timer = threading.Timer(seconds, token.cancel)
    timer.start()
    try:
        return supervisor.run(token)
    finally:
        timer.cancel()


def test_run_refuses_to_fork_beside_an_open_store_and_a_running_worker_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runifold_sync.errors import ForkUnsafe

    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    supervisor = WorkflowSupervisor(_factory(url), WorkflowSupervisorConfig(1), base_id="api")  # type: ignore[arg-type]
    store = open_store(url)
    with pytest.raises(ForkUnsafe) as refused:
        supervisor.run(CancellationToken())
    assert isinstance(refused.value, RunifoldError)
    message = str(refused.value)
    assert message.startswith("WorkflowSupervisor.run must be called from a process with no store open")
    assert "1 open store(s) (SqliteWorkflowStore)" in message and "store.close()" in message

    worker = WorkflowWorker(store, pool_app.registry(), WorkerId.parse("here"), LEASE, timedelta(seconds=1))
    worker.run_once()  # registers: its heartbeat thread runs from now on
    with pytest.raises(ForkUnsafe, match="runifold threads runifold-heartbeat-here"):
        supervisor.run(CancellationToken())
    assert store.workers()[0].worker_id == "here"  # nothing was forked: no pool worker registered
    worker.close()
    store.close()

    report = _run_briefly(supervisor)  # closed: the pool runs
    assert report.stopped_by is None and report.restarts == 0


@pytest.mark.timeout(90)
def test_a_pool_started_from_python_under_a_live_pools_base_id_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI checks before it forks (``pool_preflight``); from Python, each slot's first
    child checks its own id before it claims anything, and ``run`` raises."""
    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    with processes.reaped() as started:
        first = pool_app.spawn(url, lease_s=5.0, grace_s=10.0, concurrency=2, base_id="dup")
        started.append(first)
        with open_store(url) as store:
            processes.wait_until(lambda: len(store.workers()) == 2, 30, "the first pool")
            before = {w.worker_id: w.pid for w in store.workers()}
            store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="t1", not_before=store.now()))

        supervisor = WorkflowSupervisor(_factory(url), WorkflowSupervisorConfig(2), base_id="dup")  # type: ignore[arg-type]
        started_at = time.monotonic()
        with pytest.raises(WorkerIdInUse) as refused:
            _run_briefly(supervisor, 20.0)  # a pool that ran would stop after 20 s, reporting
        assert time.monotonic() - started_at < 15
        assert str(refused.value).startswith("worker id already live: dup-")
        assert f"pid {before['dup-0']}" in str(refused.value) or f"pid {before['dup-1']}" in str(
            refused.value
        )

        with open_store(url) as store:
            # The second pool registered nothing and claimed nothing: the first ran the task.
            assert {w.worker_id: w.pid for w in store.workers()} == before
            processes.wait_until(lambda: store.get_task("t1").state is TaskState.TERMINAL, 30, "the task")
            claims = [e.worker_id for e in store.history("t1") if e.kind == "claimed"]
            assert len(claims) == 1 and claims[0] in before
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=30)


def test_cycle_observer_is_exported() -> None:
    """What the fleet page's observer example imports (docs/howto/fleet.md runs it)."""
    from runifold_sync.worker.observer import CycleObserver

    assert runifold_sync.CycleObserver is CycleObserver and "CycleObserver" in runifold_sync.__all__
