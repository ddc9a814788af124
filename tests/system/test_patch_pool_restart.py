"""A patched deploy across a real pool restart: runs started by the old code keep the
old path once the pool runs the new code, runs started after take the new one, each body
ran once, and nothing was stranded (the patch kept the fingerprint)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.store import TaskState
from tests.support import processes
from tests.support.backends import Backend

pytestmark = pytest.mark.timeout(180)
APP = "tests.system.patch_app:registry"


def pool(backend: Backend, stage: str, ledger: Path) -> subprocess.Popen[str]:
    env = os.environ | {"PATCH_STAGE": stage, "PATCH_LEDGER": str(ledger)}
    command = ["run", "--app", APP, "--database", backend.url, "--concurrency", "1"]
    return processes.spawn(
        "runifold_sync", *command, "--worker-id", f"pool-{stage}", env=env, own_session=True
    )


def stopped(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    finally:
        processes.kill(proc)


def waiting(store: WorkflowStore, ids: list[str]) -> bool:
    return all(store.get_task(t).state is TaskState.WAITING for t in ids)


def test_old_runs_keep_the_old_path_and_new_runs_take_the_patch_across_a_pool_restart(
    backend: Backend, store: WorkflowStore, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    before = [f"before{n}" for n in range(3)]
    for n, task_id in enumerate(before):
        store.enqueue(WorkflowTask.new("patch-flow", 1, n, checkpoint_id=task_id))
    old = pool(backend, "old", ledger)
    try:
        processes.wait_until(lambda: waiting(store, before), 90, "the old pool's runs waiting for go")
    finally:
        stopped(old)
    after = [f"after{n}" for n in range(3)]
    for n, task_id in enumerate(after):
        store.enqueue(WorkflowTask.new("patch-flow", 1, 10 + n, checkpoint_id=task_id))
    new = pool(backend, "patched", ledger)
    try:
        processes.wait_until(lambda: waiting(store, after), 90, "the new pool's runs waiting for go")
        for task_id in before + after:
            store.send_signal(task_id, "go", None, signal_id=f"go-{task_id}", sender="test")
        processes.wait_until(
            lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in before + after),
            90,
            "every run finished",
        )
    finally:
        stopped(new)
    assert [store.get_task(t).result for t in before] == ["sent 0", "sent 1", "sent 2"]
    assert [store.get_task(t).result for t in after] == [
        "sent 10 checked",
        "sent 11 checked",
        "sent 12 checked",
    ]
    lines = ledger.read_text().splitlines()
    assert len(lines) == len(set(lines))  # each body of each run ran once
    assert {line.split()[1] for line in lines if line.startswith("before")} == {"pack", "send"}
    assert {line.split()[1] for line in lines if line.startswith("after")} == {"pack", "fraud_check", "send"}
    handed_back = [e for t in before + after for e in store.history(t) if e.kind == "released"]
    assert not handed_back  # nothing stranded or refused under the new code
