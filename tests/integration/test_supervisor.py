"""The forked pool under real signals: draining, graceful SIGTERM, and a child killed
mid-step being replaced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from runifold_sync import InvalidArgument, LeaseDuration, TaskState, WorkerId, WorkflowTask, WorkflowWorker
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.supervisor import CancellationToken, WorkflowSupervisor, WorkflowSupervisorConfig

from . import pool_app

ROOT = Path(__file__).resolve().parents[2]


def _enqueue(store: SqliteWorkflowStore, count: int) -> list[str]:
    ids = [f"t{n:04d}" for n in range(count)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    return ids


def _states(store: SqliteWorkflowStore, ids: list[str]) -> Counter[str]:
    return Counter(store.get_task(t).state.value for t in ids)


def _ledger(path: Path) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    return [(t, c, int(p)) for t, c, p in (line.split() for line in path.read_text().splitlines())]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("POOL_LEDGER", str(path))
    return path


@pytest.fixture
def pool(sqlite_path: Path, ledger: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start_pool(
    pool: list[subprocess.Popen[str]], db: Path, *, lease_s: float, grace_s: float
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.pool_app",
            "--db",
            str(db),
            "--lease-s",
            str(lease_s),
            "--grace-s",
            str(grace_s),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pool.append(proc)
    return proc


def test_config_rejects_bad_concurrency_and_backoff() -> None:
    with pytest.raises(InvalidArgument, match="concurrency must be an integer >= 1, got 0"):
        WorkflowSupervisorConfig(0)
    with pytest.raises(InvalidArgument, match="above maximum"):
        WorkflowSupervisorConfig(2).with_backoff(timedelta(seconds=2), timedelta(seconds=1))


@pytest.mark.timeout(120)
def test_four_processes_drain_300_five_step_tasks(sqlite_path: Path, ledger: Path) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    ids = _enqueue(store, 300)
    lease = LeaseDuration(timedelta(seconds=10))

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        return WorkflowWorker(
            SqliteWorkflowStore.open(sqlite_path), pool_app.registry(), worker_id, lease, timedelta(seconds=2)
        )

    token = CancellationToken()
    config = WorkflowSupervisorConfig(4).with_backoff(timedelta(milliseconds=10), timedelta(milliseconds=100))

    def stop_when_done() -> None:
        watcher = SqliteWorkflowStore.open(sqlite_path)
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and _states(watcher, ids)["terminal"] < len(ids):
            time.sleep(0.1)
        watcher.close()
        token.cancel()

    watcher = threading.Thread(target=stop_when_done)
    watcher.start()
    report = WorkflowSupervisor(factory, config, base_id="drain").run(token)
    watcher.join()

    assert report.outcomes["completed"] == 300
    assert set(report.per_worker) == {f"drain-{n}" for n in range(4)}
    assert report.restarts == 0
    assert all(store.get_task(t).result == n + pool_app.STEPS for n, t in enumerate(ids))
    runs = Counter((t, c) for t, c, _pid in _ledger(ledger))
    assert len(runs) == 300 * pool_app.STEPS and set(runs.values()) == {1}
    store.close()


@pytest.mark.timeout(90)
def test_sigterm_stops_pool_within_lease_plus_grace_and_leaves_no_task_leased(
    sqlite_path: Path, ledger: Path, pool: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOL_STEP_SECONDS", "0.3")
    store = SqliteWorkflowStore.open(sqlite_path)
    ids = _enqueue(store, 40)
    lease_s, grace_s = 2.0, 10.0
    proc = _start_pool(pool, sqlite_path, lease_s=lease_s, grace_s=grace_s)
    deadline = time.monotonic() + 30
    while len(_ledger(ledger)) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _states(store, ids)["leased"] >= 1, "steps should be in flight when SIGTERM arrives"

    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=lease_s + grace_s + 5)
    elapsed = time.monotonic() - stopped_at

    assert proc.returncode == 0
    assert elapsed < lease_s + grace_s
    assert json.loads(out)["outcomes"]["completed"] >= 1
    # Every started cycle ended with its lease protocol: nothing is left leased.
    states = _states(store, ids)
    assert states["leased"] == 0
    assert states["terminal"] + states["queued"] == len(ids)
    store.close()


@pytest.mark.timeout(90)
def test_child_killed_mid_step_is_replaced_and_its_task_completes_after_lease_expiry(
    sqlite_path: Path, ledger: Path, pool: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOL_STEP_SECONDS", "0.2")
    store = SqliteWorkflowStore.open(sqlite_path)
    ids = _enqueue(store, 12)
    proc = _start_pool(pool, sqlite_path, lease_s=1.5, grace_s=10.0)
    deadline = time.monotonic() + 30
    while not _ledger(ledger) and time.monotonic() < deadline:
        time.sleep(0.02)
    victim_task, victim_call, victim_pid = _ledger(ledger)[0]
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = store.now()

    deadline = time.monotonic() + 60
    while _states(store, ids)["terminal"] < len(ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)

    assert _states(store, ids)["terminal"] == len(ids)
    assert all(store.get_task(t).result == n + pool_app.STEPS for n, t in enumerate(ids))
    assert json.loads(out)["restarts"] == 1
    takeover = [
        e for e in store.history(victim_task) if e.kind == "claimed" and e.detail.get("expired_owner")
    ]
    assert len(takeover) == 1 and takeover[0].at >= killed_at + timedelta(seconds=1)
    pids = {pid for _t, _c, pid in _ledger(ledger)}
    assert victim_pid in pids and len(pids) >= 5  # four children plus the replacement
    assert store.get_task(victim_task).state is TaskState.TERMINAL
    store.close()
