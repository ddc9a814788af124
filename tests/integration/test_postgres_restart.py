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

This restarts the server every other test uses, so it runs only when the server is a
local cluster this process may control (root or the cluster owner); otherwise it skips,
or fails under ``CI``, where a restart left untested is a hole. As a courtesy it waits
until other runifold databases on it have gone quiet (skipped if they stay busy for
20 s); the server is started again whatever happens.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import psycopg
import pytest

from runifold_sync import StoreUnavailable, TaskOutcome, TaskState, WorkflowStore, WorkflowTask, open_store
from runifold_sync.codec import from_json

from . import pool_app
from .conftest import fail_in_ci_when_not_restartable

TASKS = 60
CONCURRENCY = 3
STEP_S = 0.08
LEASE_S = 3.0
RESTART_AFTER_STEPS = 60  # of TASKS * STEPS = 300: the restart lands early in the run
OTHERS_QUIET_S = 20.0
IDLE_PICKUP_LIMIT_S = 10.0


@attrs.frozen
class Cluster:
    version: str
    name: str
    port: int
    owner: str

    def ctl(self, action: str) -> None:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def online(self) -> bool:
        return any(listed.online for listed in _clusters() if listed.cluster == self)


@attrs.frozen
class _Listed:
    cluster: Cluster
    online: bool


def _clusters() -> list[_Listed]:
    out = subprocess.run(
        ["pg_lsclusters", "--no-header"], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    listed = []
    for line in out.splitlines():
        version, name, port, status, owner, *_ = line.split()
        listed.append(_Listed(Cluster(version, name, int(port), owner), status.startswith("online")))
    return listed


def _local_cluster(url: str) -> Cluster | None:
    """The cluster behind ``url`` if it runs on this host and this process may control it."""
    parts = urlsplit(url)
    if parts.hostname not in (None, "", "127.0.0.1", "localhost", "::1"):
        return None
    if shutil.which("pg_lsclusters") is None or shutil.which("pg_ctlcluster") is None:
        return None
    port = parts.port or 5432
    for listed in _clusters():
        cluster = listed.cluster
        if cluster.port == port and listed.online:
            if os.geteuid() in (0, pwd.getpwnam(cluster.owner).pw_uid):
                return cluster
    return None


_others_stayed_busy: list[bool] = []  # once they did, later tests skip without waiting again


def _wait_for_other_runifold_databases_to_go_quiet(admin_url: str, own_db: str) -> bool:
    """A restart would break another session's work on this server (someone running the
    contract suite or a chaos run meanwhile); give it a while to finish."""
    if _others_stayed_busy:
        return False
    deadline = time.monotonic() + OTHERS_QUIET_S
    with psycopg.connect(admin_url, autocommit=True) as admin:
        while True:
            busy = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname LIKE 'runifold%%' "
                "AND datname <> %s AND pid <> pg_backend_pid()",
                (own_db,),
            ).fetchone()
            if busy is None or busy[0] == 0:
                return True
            if time.monotonic() > deadline:
                _others_stayed_busy.append(True)
                return False
            time.sleep(0.5)


def _server_started_at(admin_url: str) -> object:
    with psycopg.connect(admin_url, connect_timeout=5) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


class Server:
    """The local cluster behind the test database, restarted in place."""

    def __init__(self, cluster: Cluster) -> None:
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
def server(postgres_admin_url: str, postgres_url: str) -> Iterator[Server]:
    """The server behind ``postgres_url``; torn down before that database is dropped,
    and always leaves the server running."""
    cluster = _local_cluster(postgres_admin_url)
    if cluster is None:
        fail_in_ci_when_not_restartable(postgres_admin_url)
        pytest.skip("the test PostgreSQL server is not a local cluster this process may restart")
    own_db = urlsplit(postgres_url).path.lstrip("/")
    if not _wait_for_other_runifold_databases_to_go_quiet(postgres_admin_url, own_db):
        why = f"other runifold databases on the server stayed busy for {OTHERS_QUIET_S}s"
        if os.environ.get("CI"):  # CI owns the server: a session left busy is a leak to fix
            pytest.fail(f"{why}; CI is set, so the restart must be tested, not skipped")
        pytest.skip(f"{why}; not restarting it under them")
    try:
        yield Server(cluster)
    finally:
        if not cluster.online():
            cluster.ctl("start")
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(postgres_admin_url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


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
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

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
        journal = from_json(record.checkpoint_json)["journal"]
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
