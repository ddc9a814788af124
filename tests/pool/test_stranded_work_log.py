"""A pool says in its log when ready work waits that no live worker can claim: one
warning per definition and version when such tasks start waiting, and one when none
waits any more, as ``stats`` lists them. Two kinds of stranded work: a task of a version
no worker registers, and a task checkpointed by other steps than the pool's (a deploy
that changed a step under the same version). Before, the pool's log said nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.store import TaskState
from runifold_sync.store.serving import unserved_work
from tests.support import processes
from tests.support.backends import Backend
from tests.support.routing import checkpointed_by_other_steps

from . import pool_app

LEASE_S = 2.0  # heartbeat 0.5 s: the pool looks for stranded work every 1.5 s

NEW_VERSION = "1 ready task(s) of 'pool-flow' version 2 wait that no live worker can claim: "
OTHER_STEPS = "1 ready task(s) of 'pool-flow' version 1 wait that no live worker can claim: "
CLEARED = "no ready task of 'pool-flow' version {} waits unserved any more"


@pytest.mark.timeout(120)
def test_the_pool_warns_once_of_ready_work_no_live_worker_serves_and_once_when_it_clears(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    store = backend.open()
    store.enqueue(WorkflowTask.new("pool-flow", 2, 1, checkpoint_id="v2"))
    checkpointed_by_other_steps(store, "pool-flow", 1, "changed")
    err = tmp_path / "pool.err"
    with processes.reaped() as started:
        with err.open("w") as stderr:
            proc = pool_app.spawn(backend.url, lease_s=LEASE_S, grace_s=10.0, concurrency=2, stderr=stderr)
        started.append(proc)
        processes.wait_until(
            lambda: NEW_VERSION in err.read_text() and OTHER_STEPS in err.read_text(), 60, "the warnings"
        )
        # What it says is what stats shows.
        stranded = {(w.backlog.version, w.reason) for w in unserved_work(store) if w.backlog.ready}
        log = err.read_text()
        for version, reason in stranded:
            assert (NEW_VERSION if version == 2 else OTHER_STEPS) + reason in log
        assert {version for version, _ in stranded} == {1, 2}

        for task_id in ("v2", "changed"):
            assert store.cancel(task_id, actor="test", reason="stranded") is TaskState.CANCELLED
        processes.wait_until(
            lambda: all(CLEARED.format(v) in err.read_text() for v in (1, 2)), 30, "the all-clear"
        )
        time.sleep(3 * 1.5)  # three more looks: nothing is said again
        proc.terminate()
        proc.communicate(timeout=30)

    log = err.read_text()
    for said in (NEW_VERSION, OTHER_STEPS, CLEARED.format(1), CLEARED.format(2)):
        assert log.count(said) == 1, log
