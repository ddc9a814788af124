"""``App.run_pool``: a supervised pool of real worker processes started from an App
whose store is open, on both stores; the App closes its store before the fork, the
children run every task, and the App reads the results afterwards."""

from __future__ import annotations

import json
import signal

import pytest

from runifold_sync import open_store
from runifold_sync.store import TaskOutcome
from tests.support import processes
from tests.support.backends import Backend

TASKS = 6


@pytest.mark.timeout(90)
def test_run_pool_runs_every_task_in_forked_workers_and_the_app_reads_the_results(backend: Backend) -> None:
    proc = processes.spawn("tests.app.app_pool_app", backend.url, str(TASKS), own_session=True)
    try:
        assert proc.stdout is not None
        parent = json.loads(proc.stdout.readline())["started"]
        with open_store(backend.url) as store:
            processes.wait_until(
                lambda: all(store.get_task(f"t{n}").outcome is TaskOutcome.COMPLETED for n in range(TASKS)),
                60,
                "every task to complete",
            )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        processes.kill(proc)
    assert proc.returncode == 0
    report_line, results_line = out.strip().splitlines()[-2:]
    report = json.loads(report_line)
    assert report["outcomes"]["completed"] == TASKS
    assert set(report["per_worker"]) <= {"apppool-0", "apppool-1"}
    results = json.loads(results_line)
    assert [r["n"] for r in results] == list(range(TASKS))
    assert parent not in {r["pid"] for r in results}  # run by the forked workers, not the App's process
