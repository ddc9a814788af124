"""A worker SIGKILLed inside one parallel branch after the other branch completed: the
next worker finishes only the unfinished branch. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.store import TaskState
from tests.support import ledger as ledger_file
from tests.support import processes
from tests.support.backends import Backend
from tests.support.journals import entries


def _worker(url: str, ledger: Path, worker_id: str) -> subprocess.Popen[str]:
    args = ["--database", url, "--worker-id", worker_id, "--ledger", str(ledger)]
    return processes.spawn("tests.system.branch_app", *args)


def _calls(ledger: Path) -> Counter[str]:
    return Counter(line[0] for line in ledger_file.read(ledger))


@pytest.mark.timeout(60)
def test_sigkill_mid_branch_resumes_only_the_unfinished_branch(backend: Backend, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    store = backend.open()
    store.enqueue(WorkflowTask.new("branching", 1, None, checkpoint_id="b1"))
    first = _worker(backend.url, ledger, "worker-a")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            calls = _calls(ledger)
            if calls["parallel#1/slow/slow#2"] and calls["parallel#1/quick/quick#2"]:
                break
            time.sleep(0.02)
        time.sleep(0.2)  # let the quick branch's last commit land
        quick = entries(store, "b1", "parallel#1/quick")
        assert [e["call_id"] for e in quick] == [
            "parallel#1/quick/quick#1",
            "parallel#1/quick/quick#2",
        ]
        first.send_signal(signal.SIGKILL)
    finally:
        processes.kill(first)
    (tmp_path / "ledger.txt.release").touch()
    time.sleep(1.6)  # past the dead worker's lease (store time)
    second = _worker(backend.url, ledger, "worker-b")
    out, _ = second.communicate(timeout=30)
    assert json.loads(out) == {"outcome": "completed"}
    record = store.get_task("b1")
    assert record.state is TaskState.TERMINAL and record.result == {"quick": 2, "slow": 20}
    calls = _calls(ledger)
    assert calls["parallel#1/quick/quick#1"] == 1 and calls["parallel#1/quick/quick#2"] == 1
    assert calls["parallel#1/slow/slow#1"] == 1
    assert calls["parallel#1/slow/slow#2"] == 2  # in flight at the kill, then run to completion
