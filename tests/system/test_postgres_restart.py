"""A supervised pool on PostgreSQL survives a restart of the database server.

Three worker processes are in the middle of five-step tasks when the server goes away:
either ``pg_ctlcluster ... restart`` (a fast shutdown that terminates every connection,
then a start) or a stop, a pause longer than a lease and a start. Nobody touches the
pool: its connection pools check each connection at checkout and replace broken ones,
cycles that fail on the unreachable store back off and go on in the same child, and a
task whose cycle was cut short is claimed again after its lease expires. Then the
server is restarted once more while every worker is idle in ``wait_for_work`` (LISTEN),
and work enqueued afterwards must still be picked up.

Every task completes, and no step whose checkpoint was committed ran again: each step
execution writes a ledger line with its own run id outside the store, and the committed
execution of every step (its run id is in the checkpoint) is the last one in the ledger.

The server restarted is this test process's private cluster (``private_postgres``,
``tests/support/pgcluster.py``), never the shared one every other test uses; where no
private cluster can be made the test skips, or fails under ``CI``, where a restart left
untested is a hole. The cluster is started again whatever happens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.errors import StoreUnavailable
from runifold_sync.store import TaskOutcome, TaskState
from tests.pool import pool_app
from tests.support import processes
from tests.support.journals import entries
from tests.support.pgcluster import PrivateCluster

TASKS = 60
CONCURRENCY = 3
STEP_S = 0.08
LEASE_S = 3.0
RESTART_AFTER_STEPS = 60  # of TASKS * STEPS = 300: the restart lands early in the run
IDLE_PICKUP_LIMIT_S = 10.0


def _server_started_at(admin_url: str) -> object:
    with psycopg.connect(admin_url, connect_timeout=5) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


class Server:
    """The private cluster behind the test database, restarted in place."""

    def __init__(self, cluster: PrivateCluster) -> None:
        self._cluster = cluster

    def restart(self) -> None:
        """``pg_ctlcluster restart``: a fast shutdown (every connection is terminated)
        and a start; the server is gone for about a second."""
        self._cluster.ctl("restart")

    def outage(self, down_s: float) -> None:
        """Stop the server, keep it down for ``down_s``, start it again."""
        self._cluster.ctl("stop")
        time.sleep(down_s)
        self._cluster.ctl("start")


@pytest.fixture
def postgres_admin_url(private_postgres: PrivateCluster) -> str:
    """The test databases (``postgres_url``) live on the private cluster this test restarts."""
    return private_postgres.admin_url


@pytest.fixture
def server(private_postgres: PrivateCluster, postgres_url: str) -> Iterator[Server]:
    """The server behind ``postgres_url``; torn down before that database is dropped,
    and always leaves the server running."""
    try:
        yield Server(private_postgres)
    finally:
        private_postgres.ensure_running()


def _terminal_count(store: WorkflowStore, ids: list[str]) -> int:
    return sum(store.get_task(t).state is TaskState.TERMINAL for t in ids)


def _wait_until_terminal(
    store: WorkflowStore, ids: list[str], proc: subprocess.Popen[str], err: Path
) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            if _terminal_count(store, ids) == len(ids):
                return
        except StoreUnavailable:
            pass
        assert proc.poll() is None, err.read_text()
        assert time.monotonic() < deadline, f"the pool did not finish {len(ids)} tasks"
        time.sleep(0.05)


def _enqueue(store: WorkflowStore, prefix: str, count: int) -> list[str]:
    ids = [f"{prefix}{n:03d}" for n in range(count)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-traced", 1, n, checkpoint_id=task_id))
    return ids


# "restart": pg_ctlcluster restart with the default pool timeout (30 s): calls made while
# the server is away wait for a new connection, and most leases survive the second.
# "outage": down for longer than a lease, and a 1 s pool timeout: store calls fail with
# StoreUnavailable, cycles fail and back off, heartbeats fail until the leases are lost,
# and every task that was in flight is claimed again after the server is back.
MODES = {"restart": None, "outage": 1.0}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", list(MODES))
def test_pool_survives_a_postgres_restart_and_no_committed_step_runs_again(
    mode: str,
    postgres_url: str,
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = tmp_path / "ledger.txt"
    err = tmp_path / "pool.err"
    monkeypatch.setenv("POOL_LEDGER", str(ledger))
    monkeypatch.setenv("POOL_STEP_SECONDS", str(STEP_S))
    store = open_store(postgres_url)
    ids = _enqueue(store, "r", TASKS)

    with open(err, "w") as stderr:
        proc = pool_app.spawn(
            postgres_url,
            lease_s=LEASE_S,
            grace_s=30.0,
            concurrency=CONCURRENCY,
            backoff_s=(0.01, 0.2),
            pool_timeout_s=MODES[mode],
            stderr=stderr,
        )
    try:
        # 1. The server goes away while every worker is in the middle of a task.
        deadline = time.monotonic() + 60
        while len(pool_app.read_ledger(ledger)) < RESTART_AFTER_STEPS:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the pool never got going"
            time.sleep(0.02)
        server_before = _server_started_at(postgres_url)
        began = time.monotonic()
        if mode == "restart":
            server.restart()
        else:
            server.outage(LEASE_S + 1.0)
        down_s = time.monotonic() - began
        assert _server_started_at(postgres_url) != server_before, "the server was not restarted"
        done_at_restart = _terminal_count(store, ids)
        assert done_at_restart < TASKS, "the restart should land while tasks are still running"
        _wait_until_terminal(store, ids, proc, err)
        busy_recovery_s = time.monotonic() - began

        # 2. The server goes away while every worker is idle in wait_for_work (LISTEN);
        # new work must still be noticed afterwards.
        time.sleep(0.5)
        server.restart()
        enqueued_at = time.time()
        late = _enqueue(store, "after", CONCURRENCY)
        _wait_until_terminal(store, late, proc, err)
        first_steps = [line.at for line in pool_app.read_ledger(ledger) if line.task_id in late]
        idle_pickup_s = min(first_steps) - enqueued_at
        # Idle waits back off at most 0.2 s; a LISTEN lost with the server must not leave
        # new work unnoticed for long (generous for a loaded machine, far below the deadline).
        assert idle_pickup_s < IDLE_PICKUP_LIMIT_S, f"new work started {idle_pickup_s:.2f} s after enqueue"

        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=45)
    finally:
        processes.kill(proc)

    assert proc.returncode == 0, err.read_text()
    report = json.loads(out)
    assert report["restarts"] == 0  # no child died: every failed cycle was survived in place
    assert set(report["per_worker"]) == {f"pool-{n}" for n in range(CONCURRENCY)}
    all_ids = ids + late
    expected = {t: n + pool_app.STEPS for batch in (ids, late) for n, t in enumerate(batch)}
    # A cycle cut short by the restart reports nothing; its task completes in a later one.
    assert len(all_ids) - CONCURRENCY <= report["outcomes"]["completed"] <= len(all_ids)

    executions: dict[tuple[str, str], list[str]] = defaultdict(list)
    for line in pool_app.read_ledger(ledger):
        executions[(line.task_id, line.call_id)].append(line.run_id)
    for task_id in all_ids:
        record = store.get_task(task_id)
        assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), (
            task_id,
            record.reason,
        )
        assert record.result == expected[task_id]
        assert record.checkpoint_json is not None
        journal = entries(store, task_id)
        assert [e["call_id"] for e in journal] == [f"traced_work#{k}" for k in range(1, pool_app.STEPS + 1)]
        for entry in journal:
            runs = executions[(task_id, entry["call_id"])]
            # The committed execution is the last one: nothing ran the step after it.
            assert runs and runs[-1] == entry["output"]["run"], (task_id, entry["call_id"], runs)
    assert len(executions) == len(all_ids) * pool_app.STEPS
    # Only a step in flight when the server went away can have run twice: one per worker.
    rerun = {key: runs for key, runs in executions.items() if len(runs) > 1}
    assert all(len(runs) == 2 for runs in rerun.values()) and len(rerun) <= CONCURRENCY, rerun

    log = err.read_text()
    print(
        f"\n[{mode}] server away for {down_s:.2f} s with {done_at_restart}/{TASKS} tasks done; all "
        f"done {busy_recovery_s:.2f} s after it began; failed cycles: {log.count('cycle failed')}, "
        f"failed idle waits: {log.count('waiting for work failed')}, failed heartbeats: "
        f"{log.count('heartbeat failed')}, lease lost: {report['outcomes'].get('lease_lost', 0)}; "
        f"re-run steps: {len(rerun)}; first step {idle_pickup_s:.2f} s after an enqueue "
        "that followed an idle restart"
    )
    store.close()
