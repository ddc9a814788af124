"""A store outage and a worker death together do not stop a pool.

A 2-worker pool on PostgreSQL is busy when the store becomes unreachable to new
connections, either because the server is stopped or because every connection slot is
taken, and then one child is SIGKILLed. Its replacement cannot open the store and exits;
that is no crash loop (the rule that stops a pool after 5 quick deaths in a row): the
supervisor forks it again with a growing delay, saying so in its log, while the healthy
child runs on in the same process. When the store answers again the replacement starts,
hands back what the dead child held, and every task completes with no committed step run
twice. Before, the pool stopped itself within 2 s, the healthy worker with it.

The server is this test process's private cluster (``private_postgres``), which the test
stops, starts and fills; the shared server is never touched.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.errors import StoreUnavailable
from runifold_sync.store import TaskState
from tests.pool import pool_app
from tests.support import processes
from tests.support.pgcluster import PrivateCluster

TASKS = 40
STEP_S = 0.05
LEASE_S = 4.0
OUTAGE_S = 6.0  # three times as long as the old crash-loop rule took to stop the pool


@pytest.fixture
def postgres_admin_url(private_postgres: PrivateCluster) -> str:
    """The test database (``postgres_url``) lives on the private cluster."""
    return private_postgres.admin_url


@pytest.fixture
def cluster(private_postgres: PrivateCluster, postgres_url: str) -> Iterator[PrivateCluster]:
    """The server behind ``postgres_url``, left running whatever the test did."""
    try:
        yield private_postgres
    finally:
        private_postgres.ensure_running()


def _done(store: WorkflowStore, ids: list[str]) -> int:
    try:
        return sum(store.get_task(t).state is TaskState.TERMINAL for t in ids)
    except StoreUnavailable:
        return 0


def _fill_connection_slots(admin_url: str) -> list[psycopg.Connection[tuple[object, ...]]]:
    """Connections until the server refuses one for want of slots."""
    held = []
    while True:
        try:
            held.append(psycopg.connect(admin_url, connect_timeout=5))
        except psycopg.OperationalError as exc:
            assert "too many clients" in str(exc), exc
            return held


@pytest.mark.timeout(240)
@pytest.mark.parametrize("outage", ["server stopped", "connection slots full"])
def test_a_worker_killed_while_the_store_is_unreachable_is_retried_and_the_pool_carries_on(
    outage: str, cluster: PrivateCluster, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("POOL_LEDGER", str(ledger))
    monkeypatch.setenv("POOL_STEP_SECONDS", str(STEP_S))
    store = open_store(postgres_url)
    ids = [f"u{n:03d}" for n in range(TASKS)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-traced", 1, n, checkpoint_id=task_id))
    err = tmp_path / "pool.err"
    fillers: list[psycopg.Connection[tuple[object, ...]]] = []
    with processes.reaped() as started:
        with err.open("w") as stderr:
            proc = pool_app.spawn(
                postgres_url, lease_s=LEASE_S, grace_s=30.0, concurrency=2, pool_timeout_s=1.0, stderr=stderr
            )
        started.append(proc)
        processes.wait_until(
            lambda: len({line.pid for line in pool_app.read_ledger(ledger)}) == 2, 60, "two busy"
        )
        victim, healthy = sorted({line.pid for line in pool_app.read_ledger(ledger)})
        try:
            if outage == "server stopped":
                cluster.ctl("stop")
                os.kill(victim, signal.SIGKILL)
            else:
                # Held still while the slots fill, so its replacement cannot take the dead
                # child's slot first; then it reaps and forks as it would have.
                os.kill(proc.pid, signal.SIGSTOP)
                os.kill(victim, signal.SIGKILL)
                time.sleep(0.5)  # the dead child's server processes end
                fillers = _fill_connection_slots(cluster.admin_url)
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(OUTAGE_S)
            assert proc.poll() is None, err.read_text()  # the pool did not stop itself
            os.kill(healthy, 0)  # and the healthy worker is the same process
        finally:
            for conn in fillers:
                conn.close()
            cluster.ensure_running()
        deadline = time.monotonic() + 90
        while _done(store, ids) < TASKS:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, f"the pool did not finish: {_done(store, ids)}/{TASKS}"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=45)

    assert proc.returncode == 0, err.read_text()
    log = err.read_text()
    print(f"\n[{outage}] supervisor log:\n{log}")
    assert "crashed" not in log
    # Said once as a warning (the retries that follow are at info level), and the end of it.
    assert log.count("could not reach the store as it started") == 1, log
    assert "started: the store answers again" in log
    assert "times in a row" not in log  # no crash-loop stop
    report = json.loads(out)
    assert report["restarts"] >= 2  # the kill, and at least one start that found no store
    for n, task_id in enumerate(ids):
        assert store.get_task(task_id).result == n + pool_app.STEPS
    runs = Counter((line.task_id, line.call_id) for line in pool_app.read_ledger(ledger))
    assert len(runs) == TASKS * pool_app.STEPS
    # Only steps in flight when the store went away (one per worker) can have run twice.
    assert sum(count - 1 for count in runs.values()) <= 2
    store.close()
