"""A pool that cannot start says so and stops: ``run`` checks the store before it forks
(unreachable server, wrong database, missing SQLite directory), refuses a worker id
that is live in another pool, and a slot whose children keep dying at start stops the
pool with a non-zero exit instead of forking them for ever (before: 238 restarts in ten
minutes, and SIGTERM then exited 0)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from runifold_sync import WorkerId, WorkflowTask, open_store
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.pool.supervisor import MAX_START_FAILURES, WorkflowSupervisor, WorkflowSupervisorConfig
from runifold_sync.store import TaskState
from runifold_sync.worker.worker import WorkflowWorker
from tests.support import processes

APP = "tests.pool.pool_app:registry"


def run_pool(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return processes.run("runifold_sync", "run", "--app", APP, *args, timeout_s=timeout_s)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "postgresql://postgres@127.0.0.1:1/postgres",
            "cannot connect to PostgreSQL database postgres at 127.0.0.1:1",
        ),
        (
            "postgresql://postgres@127.0.0.1:5432/runifold_no_such_db",
            'database "runifold_no_such_db" does not exist',
        ),
        ("sqlite:////runifold-no-such-dir/workflows.db", "directory of SQLite path"),
    ],
    ids=["server-down", "wrong-database", "missing-directory"],
)
def test_run_with_a_store_it_cannot_open_exits_1_before_forking_naming_why(url: str, said: str) -> None:
    started = time.monotonic()
    done = run_pool("--database", url, "--concurrency", "2")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: ") and said in done.stderr, done.stderr
    assert "restarting" not in done.stderr and "crashed" not in done.stderr  # no child was forked
    assert time.monotonic() - started < 30


def _failing_factory(worker_id: WorkerId) -> WorkflowWorker:
    raise RuntimeError("the app's settings module is broken")


@pytest.mark.timeout(60)
def test_a_slot_whose_children_keep_dying_at_start_stops_the_pool_naming_it() -> None:
    config = WorkflowSupervisorConfig(2).with_backoff(timedelta(milliseconds=10), timedelta(milliseconds=200))
    started = time.monotonic()
    report = WorkflowSupervisor(_failing_factory, config, base_id="broken").run(CancellationToken())
    assert time.monotonic() - started < 30
    assert report.stopped_by is not None
    assert f"within 10 s of starting {MAX_START_FAILURES} times in a row" in report.stopped_by
    assert report.stopped_by.startswith("worker broken-")
    assert report.restarts <= 2 * MAX_START_FAILURES


@pytest.mark.timeout(60)
def test_a_stop_while_a_slot_keeps_failing_to_start_is_reported_as_a_failed_start() -> None:
    config = WorkflowSupervisorConfig(1).with_backoff(
        timedelta(milliseconds=10), timedelta(milliseconds=2000)
    )
    token = CancellationToken()
    threading.Timer(1.0, token.cancel).start()  # as a SIGTERM would, after two or three quick deaths
    report = WorkflowSupervisor(_failing_factory, config, base_id="broken").run(token)
    assert report.stopped_by is not None and "broken-0 kept failing to start" in report.stopped_by


def _slowly_failing_factory(starts: Path, worker_id: WorkerId) -> WorkflowWorker:
    with starts.open("a") as log:
        log.write(f"{os.getpid()}\n")  # the test stops the pool once a third child started
    time.sleep(0.4)  # dies 0.4 s after each start: most of the time a child is starting
    raise RuntimeError("the app's settings module is broken")


@pytest.mark.timeout(60)
def test_a_stop_while_a_failing_slots_new_child_is_starting_is_reported_as_a_failed_start(
    tmp_path: Path,
) -> None:
    """The stop comes once the slot's third child has started, after two quick deaths:
    the slot is then in a run of quick deaths whether the stop finds that child alive or
    dead and waiting to be forked again (the backoff has grown past the stop's wait).
    Waiting for the third start, not for a time, keeps the race the same under load."""
    config = WorkflowSupervisorConfig(1).with_backoff(
        timedelta(milliseconds=10), timedelta(milliseconds=2000)
    )
    starts = tmp_path / "starts.txt"
    token = CancellationToken()

    def stop_after_the_third_start() -> None:
        processes.wait_until(
            lambda: starts.exists() and len(starts.read_text().splitlines()) >= 3, 30, "a third child"
        )
        token.cancel()

    stopper = threading.Thread(target=stop_after_the_third_start)
    stopper.start()
    factory = functools.partial(_slowly_failing_factory, starts)
    report = WorkflowSupervisor(factory, config, base_id="broken").run(token)
    stopper.join()
    assert report.restarts >= 2
    assert report.stopped_by is not None and "broken-0 kept failing to start" in report.stopped_by


@pytest.mark.timeout(90)
def test_a_second_pool_under_a_live_worker_id_refuses_to_start_and_starts_once_the_first_is_gone(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt")}
    pool = ["run", "--app", APP, "--database", url, "--worker-id", "dup", "--heartbeat", "1", "--lease", "5"]
    with open_store(url) as store, processes.reaped() as started:
        first = processes.spawn("runifold_sync", *pool, env=env, own_session=True)
        started.append(first)
        processes.wait_until(lambda: any(w.worker_id == "dup-0" for w in store.workers()), 30, "the first")
        [live] = [w for w in store.workers() if w.worker_id == "dup-0"]

        second = processes.run("runifold_sync", *pool, timeout_s=60, env=env)
        assert second.returncode == 1
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: worker id already live: dup-0 (host ")
        assert f"pid {live.pid}" in last and "--worker-id" in last

        processes.kill(first)  # SIGKILL: its row still looks live, but its process is gone
        processes.wait_until(lambda: not Path(f"/proc/{live.pid}").exists(), 10, "the killed worker reaped")
        third = processes.spawn("runifold_sync", *pool, env=env, own_session=True)
        started.append(third)
        processes.wait_until(
            lambda: any(w.worker_id == "dup-0" and w.pid != live.pid for w in store.workers()),
            30,
            "the third",
        )
        store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="after"))
        processes.wait_until(lambda: store.get_task("after").state is TaskState.TERMINAL, 30, "a task on it")
        os.killpg(third.pid, signal.SIGTERM)
        out, _ = third.communicate(timeout=30)
        assert third.returncode == 0 and out.startswith("stopped.")


def test_json_report_of_a_pool_that_stopped_itself_says_why(tmp_path: Path) -> None:
    """``run --json`` carries ``stopped_by`` (here: null for a clean stop by SIGTERM)."""
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt")}
    proc = processes.spawn(
        "runifold_sync", "run", "--app", APP, "--database", url, "--json", env=env, own_session=True
    )
    try:
        with open_store(url) as store:
            processes.wait_until(lambda: bool(store.workers()), 30, "the pool")
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        processes.kill(proc)
    assert proc.returncode == 0 and json.loads(out)["stopped_by"] is None
