"""What an operator reads while the store is away: one warning per worker process when it
stops answering, naming the database, and one when it answers again; no traceback for a
plain outage, and none of psycopg_pool's warning per reconnection attempt.

Before, each failed cycle, heartbeat and registry update logged a traceback, and for up
to the pool timeout (30 s) only psycopg's "error connecting" warnings said anything.

The PostgreSQL server stopped here is this test process's private cluster
(``private_postgres``, ``tests/support/pgcluster.py``), never the shared one; the
SQLite case holds the database's write lock from another connection past the store's
busy timeout.
"""

from __future__ import annotations

import logging
import re
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    WorkerId,
    WorkerReport,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.errors import StoreUnavailable
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome
from tests.pool import pool_app
from tests.support import processes
from tests.support.pgcluster import PrivateCluster

APP = "tests.pool.pool_app:registry"
TASKS = 12
CONCURRENCY = 2
SECRET = "s3cret-outage"
DOWN = " is unavailable, retrying until it answers ("
BACK = " is available again after "


@pytest.fixture
def postgres_admin_url(private_postgres: PrivateCluster) -> str:
    """The test database (``postgres_url``) lives on the private cluster this test stops."""
    return private_postgres.admin_url


@pytest.fixture
def server(private_postgres: PrivateCluster, postgres_url: str) -> Iterator[PrivateCluster]:
    """Torn down before the test database is dropped; leaves the server running."""
    try:
        yield private_postgres
    finally:
        private_postgres.ensure_running()


def _lines_per_pid(log: str, text: str) -> Counter[int]:
    """How many lines of ``log`` (the text format, ``[pid]`` after the logger) say ``text``, per pid."""
    return Counter(int(m[1]) for m in re.finditer(rf"^.*\[(\d+)\] .*{re.escape(text)}.*$", log, re.M))


def _all_completed(store: WorkflowStore, ids: list[str]) -> bool:
    try:
        return all(store.get_task(t).outcome is TaskOutcome.COMPLETED for t in ids)
    except StoreUnavailable:  # this test's own store reconnects too
        return False


@pytest.mark.timeout(180)
def test_a_postgres_outage_is_said_once_per_worker_naming_the_database_and_once_when_it_is_back(
    postgres_url: str, server: PrivateCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = urlsplit(postgres_url)
    url = parts._replace(netloc=f"postgres:{SECRET}@{parts.hostname}:{parts.port}").geturl()  # trust auth
    where = f"PostgreSQL database {parts.path.lstrip('/')} at {parts.hostname}:{parts.port}"
    ledger, err = tmp_path / "ledger.txt", tmp_path / "run.err"
    monkeypatch.setenv("POOL_LEDGER", str(ledger))
    monkeypatch.setenv("POOL_STEP_SECONDS", "0.1")
    store = open_store(url)
    ids = [f"t{n:02d}" for n in range(TASKS)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    args = ["run", "--app", APP, "--database", url, "--concurrency", str(CONCURRENCY)]
    with open(err, "w") as stderr:
        proc = processes.spawn(
            "runifold_sync", *args, "--lease", "3", "--heartbeat", "1", stderr=stderr, own_session=True
        )
    try:
        processes.wait_until(lambda: len(pool_app.read_ledger(ledger)) >= 5, 60, "steps running")
        server.ctl("stop")
        # Said while the server is still down, not after the 30 s pool timeout.
        processes.wait_until(
            lambda: sum(_lines_per_pid(err.read_text(), DOWN).values()) >= CONCURRENCY,
            15,
            "each worker to say the store is unavailable",
            poll_s=0.1,
        )
        time.sleep(2)  # cycles, heartbeats and reconnections keep failing meanwhile
        assert server.online() is False
        server.ctl("start")
        processes.wait_until(lambda: _all_completed(store, ids), 90, "every task to complete", poll_s=0.2)
        processes.wait_until(
            lambda: sum(_lines_per_pid(err.read_text(), BACK).values()) >= CONCURRENCY,
            30,
            "each worker to say the store is back",
            poll_s=0.1,
        )
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=45)
    finally:
        processes.kill(proc)
        store.close()
    log = err.read_text()
    assert proc.returncode == 0, log[-3000:]
    down, back = _lines_per_pid(log, DOWN), _lines_per_pid(log, BACK)
    assert len(down) == CONCURRENCY and set(down.values()) == {1}, log[-3000:]
    assert back == down, log[-3000:]
    for line in log.splitlines():
        if DOWN in line or BACK in line:
            assert (
                "WARNING runifold_sync.store" in line and f"{where}{DOWN if DOWN in line else BACK}" in line
            )
    assert "Traceback" not in log
    assert "error connecting in 'runifold'" not in log  # psycopg_pool's, once per attempt
    assert SECRET not in log


@pytest.mark.timeout(60)
def test_a_locked_sqlite_database_is_said_once_and_again_when_the_worker_gets_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "workflows.db"
    store = SqliteWorkflowStore.open(path, busy_timeout=timedelta(milliseconds=20))
    store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="t1"))
    worker = WorkflowWorker(
        store,
        pool_app.registry(),
        WorkerId.parse("w1"),
        LeaseDuration(timedelta(seconds=5)),
        timedelta(seconds=1),
    )
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # every write the worker tries is refused: database is locked
    caplog.set_level(logging.DEBUG, logger="runifold_sync")
    reports: list[WorkerReport] = []
    loop = threading.Thread(
        target=lambda: reports.append(
            worker.run(
                CancellationToken(),
                max_tasks=1,
                min_backoff=timedelta(milliseconds=10),
                max_backoff=timedelta(milliseconds=50),
            )
        )
    )
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
            loop.start()
            time.sleep(1.0)  # about twenty failed cycles
            holder.rollback()
            loop.join(30)
    finally:
        holder.close()
        worker.close()
    assert reports == [WorkerReport({"completed": 1}, tasks=1, reached_max_tasks=True)]
    said = [r for r in caplog.records if r.name.startswith("runifold_sync")]
    warnings = [r.getMessage() for r in said if r.levelno >= logging.WARNING]
    assert warnings[0] == (
        f"SQLite database {str(path)!r}{DOWN}worker w1: cycle failed; backing off: "
        f"SQLite query register_worker on {str(path)!r} failed: database is locked)"
    ), warnings
    assert len(warnings) == 2 and warnings[1].startswith(f"SQLite database {str(path)!r}{BACK}"), warnings
    assert sum("still unavailable" in r.getMessage() for r in said) >= 5  # the rest, at debug level
    assert not [r for r in said if r.exc_info]
    assert store.get_task("t1").outcome is TaskOutcome.COMPLETED
    store.close()
