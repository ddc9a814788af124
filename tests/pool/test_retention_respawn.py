"""A pool's retention process killed with SIGKILL is started again: ``python -m
runifold_sync run --retention 3s`` on SQLite and PostgreSQL, its retention process (the
pid it logs, checked in ``/proc`` to be the pool's child running ``retention_process``)
killed; the pool says it died with exit code -9 and restarts it, and the tasks the pool
finishes afterwards are still pruned once they age."""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.errors import TaskNotFound
from runifold_sync.pool import sidecar
from runifold_sync.store import TaskState
from tests.support import processes
from tests.support.backends import Backend

APP = "tests.pool.pool_app:registry"


def _stored(store: WorkflowStore, task_id: str) -> bool:
    try:
        store.get_task(task_id)
    except TaskNotFound:
        return False
    return True


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _runs_retention(pid: int) -> bool:
    try:
        return b"runifold_sync.pool.retention_process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False


def _enqueue(store: WorkflowStore, prefix: str) -> list[str]:
    ids = [f"{prefix}{n}" for n in range(4)]
    store.enqueue_many([WorkflowTask.new("pool-flow", 1, n, checkpoint_id=t) for n, t in enumerate(ids)])
    return ids


@pytest.mark.timeout(150)
def test_a_killed_retention_process_is_restarted_and_pruning_goes_on(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.open()
    store.migrate()
    first = _enqueue(store, "a")
    command = ["run", "--app", APP, "--database", backend.url, "--concurrency", "1", "--retention", "3s"]
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt")}
    log_path = tmp_path / "pool.err"
    with log_path.open("w") as errors, processes.reaped() as started:
        pool = processes.spawn("runifold_sync", *command, env=env, stderr=errors, own_session=True)
        started.append(pool)
        processes.wait_until(lambda: not any(_stored(store, t) for t in first), 60, "the first tasks pruned")
        found = re.search(r"pruning tasks finished more than \S+ ago \(process (\d+)\)", log_path.read_text())
        assert found is not None, log_path.read_text()
        pruner = int(found.group(1))
        assert _runs_retention(pruner) and _parent(pruner) == pool.pid

        os.kill(pruner, signal.SIGKILL)
        restarted: list[int] = []

        def started_again() -> bool:
            again = re.search(r"retention process restarted \(process (\d+)\)", log_path.read_text())
            restarted[:] = [] if again is None else [int(again.group(1))]
            return again is not None

        processes.wait_until(started_again, 30, "the retention process to be started again")
        [replacement] = restarted
        assert replacement != pruner
        assert _runs_retention(replacement) and _parent(replacement) == pool.pid
        assert not _runs_retention(pruner)  # the killed one was reaped, not left a zombie

        later = _enqueue(store, "b")
        processes.wait_until(
            lambda: all(
                not _stored(store, t) or store.get_task(t).state is TaskState.TERMINAL for t in later
            ),
            60,
            "the later tasks finished",
        )
        processes.wait_until(lambda: not any(_stored(store, t) for t in later), 60, "the later tasks pruned")
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=60) == 0
    logged = log_path.read_text()
    died = f"retention process (pid {pruner}) died with exit code -9 (SIGKILL); restarting it in 1 s"
    assert died in logged, logged
    assert re.search(r"retention stopped; [1-4] tasks pruned", logged), logged  # the replacement's
    assert not _runs_retention(replacement)  # stopped with the pool
    assert "Traceback" not in logged, logged


@pytest.mark.timeout(60)
def test_a_kept_process_that_keeps_dying_is_restarted_ever_later(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A process that exits at once (a broken install) is restarted after a delay that
    doubles at each death in a row, capped, each death logged with its exit code."""
    monkeypatch.setattr(sidecar, "FIRST_RESTART_S", 0.05)
    monkeypatch.setattr(sidecar, "MAX_RESTART_S", 0.2)
    caplog.set_level(logging.INFO, "tests.kept")
    kept = sidecar.KeptProcess(
        "failing process",
        [sys.executable, "-c", "raise SystemExit(3)"],
        os.environ,
        logging.getLogger("tests.kept"),
    )
    try:
        died_at: list[float] = []
        while len(died_at) < 5:
            had = kept.pid
            kept.tend()
            if had is not None and kept.pid is None:
                died_at.append(time.monotonic())
            time.sleep(0.005)
    finally:
        kept.stop()
    assert kept.restarts == 4 and kept.pid is None
    deaths = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    assert len(deaths) == 5 and all("died with exit code 3; restarting it in" in d for d in deaths)
    gaps = [b - a for a, b in zip(died_at, died_at[1:], strict=False)]
    assert gaps[0] >= 0.05 and all(gap >= 0.2 for gap in gaps[2:]), gaps  # 0.05, 0.1, then 0.2 capped
