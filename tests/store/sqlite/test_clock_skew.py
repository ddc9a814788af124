"""SQLite store time is one clock for every process on the file (``sqlite_clock``): a
worker whose wall clock is an hour off, made so with libfaketime (Debian ``faketime``),
neither takes a live lease from a healthy worker nor leaves the tasks it held stranded
when it is killed. On the code before the host clock, the skewed worker took over every
running task at once (its steps ran twice) and a killed one's tasks stayed leased for an
hour."""

from __future__ import annotations

import glob
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.store import TaskState
from tests.pool import pool_app
from tests.support import processes

LEASE_S = 2.0
STEP_S = 0.5


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        message = "libfaketime is not installed (Debian package faketime)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run the clock-skew tests")
        pytest.skip(message)
    return found[0]


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    monkeypatch.setenv("POOL_STEP_SECONDS", str(STEP_S))
    return f"sqlite:///{tmp_path / 'workflows.db'}"


@pytest.fixture
def pools() -> Iterator[list[subprocess.Popen[str]]]:
    with processes.reaped() as started:
        yield started


# libfaketime 0.9.10 moves the deadline of an absolute sleep on the monotonic clock by
# the fake offset even when told not to fake that clock, and Python's time.sleep sleeps
# that way: an hour ahead, every sleep failed with EINVAL. The skewed processes sleep in
# select() instead, whose timeout is relative.
_SELECT_SLEEP = """import select, time


def _sleep(seconds):
    if seconds > 0:
        select.select([], [], [], seconds)


time.sleep = _sleep
"""


def start(
    pools: list[subprocess.Popen[str]],
    url: str,
    base_id: str,
    skew: str | None = None,
    *,
    shim: Path | None = None,
) -> None:
    env = dict(os.environ)
    if skew is not None:
        # Every process of this pool sees its wall clock shifted. Its monotonic clock is
        # left alone, as a wall clock set wrong leaves it: libfaketime would shift that
        # one to the fake wall time too, and then the C library's timed waits (under
        # every threading wait) never end, so heartbeats stop for a reason of their own.
        assert shim is not None
        (shim / "sitecustomize.py").write_text(_SELECT_SLEEP)
        env |= {
            "LD_PRELOAD": libfaketime(),
            "FAKETIME": skew,
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join([str(shim), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
    pools.append(pool_app.spawn(url, lease_s=LEASE_S, grace_s=5.0, concurrency=2, base_id=base_id, env=env))


def enqueue(url: str, count: int, first: int = 0) -> list[str]:
    with open_store(url) as store:
        ids = [f"t{n:02d}" for n in range(first, first + count)]
        for n, task_id in enumerate(ids):
            store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    return ids


def ledger_lines(tmp_path: Path) -> list[pool_app.LedgerLine]:
    return pool_app.read_ledger(tmp_path / "ledger.txt")


def wait_all_terminal(store: WorkflowStore, ids: list[str], timeout_s: float) -> None:
    processes.wait_until(
        lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in ids),
        timeout_s,
        "every task terminal",
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("skew", ["+1h", "-1h"])
def test_a_worker_with_its_clock_an_hour_off_takes_no_live_lease(
    url: str, tmp_path: Path, pools: list[subprocess.Popen[str]], skew: str
) -> None:
    """The skewed pool starts while the healthy one runs every task there is (an hour
    ahead, it took them over at once); then both share new tasks (an hour behind, it
    never saw them as due, and its leases looked expired to the healthy pool)."""
    running = enqueue(url, 2)
    start(pools, url, "healthy")
    processes.wait_until(
        lambda: {line.task_id for line in ledger_lines(tmp_path)} == set(running), 30, "both"
    )
    start(pools, url, "skewed", skew, shim=tmp_path)
    with open_store(url) as store:
        wait_all_terminal(store, running, 60)
        shared = enqueue(url, 8, first=2)
        wait_all_terminal(store, shared, 60)
        claims = Counter(
            (event.worker_id or "").rpartition("-")[0]
            for task_id in running + shared
            for event in store.history(task_id)
            if event.kind == "claimed"
        )
    steps = Counter((line.task_id, line.call_id) for line in ledger_lines(tmp_path))
    assert len(steps) == 10 * pool_app.STEPS
    assert [step for step, runs in steps.items() if runs > 1] == []  # no step ran twice
    assert sum(claims.values()) == 10, claims  # one claim per task: no takeover
    assert claims["skewed"] > 0, claims  # the skewed pool claimed new work


@pytest.mark.timeout(120)
def test_the_tasks_of_a_killed_worker_whose_clock_was_ahead_are_claimed_one_lease_after_the_kill(
    url: str, tmp_path: Path, pools: list[subprocess.Popen[str]]
) -> None:
    ids = enqueue(url, 2)
    start(pools, url, "skewed", "+1h", shim=tmp_path)
    processes.wait_until(
        lambda: {line.task_id for line in ledger_lines(tmp_path)} == set(ids), 30, "both tasks"
    )
    processes.kill(pools.pop())
    killed_at = time.time()
    with open_store(url) as store:
        held = [t for t in ids if store.get_task(t).state is TaskState.LEASED]
        assert held, "the skewed pool finished every task before the kill"
        start(pools, url, "healthy")
        wait_all_terminal(store, ids, 60)
    # The healthy pool's lines: after the kill, and not an hour ahead (the skewed pool's).
    resumed_at = {
        task_id: min(
            line.at
            for line in ledger_lines(tmp_path)
            if line.task_id == task_id and killed_at < line.at < killed_at + 1800
        )
        for task_id in held
    }
    waited_s = {task_id: round(at - killed_at, 2) for task_id, at in resumed_at.items()}
    # A lease, plus the new pool's start and a claim backoff; an hour on the old clock.
    assert max(waited_s.values()) < LEASE_S + 4, waited_s
