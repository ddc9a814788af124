"""A step that holds the GIL past its lease starves the heartbeat thread. Another worker
takes the task over; the starved worker must not commit anything afterwards. On both
stores: a SQLite file, and a fresh PostgreSQL database."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runifold_sync import TaskState, WorkflowTask

from .conftest import Backend
from .starve_app import hold_the_gil

ROOT = Path(__file__).resolve().parents[2]


def _gil_hog_size(target_s: float) -> int:
    """The regex size whose match holds the GIL for about ``target_s`` here."""
    n = 16
    while True:
        started = time.monotonic()
        hold_the_gil(n)
        took = time.monotonic() - started
        if took > 0.05:
            return n + max(0, math.ceil(math.log2(target_s / took)))
        n += 2


def _worker(url: str, ledger: Path, worker_id: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.starve_app",
            "--url",
            url,
            "--worker-id",
            worker_id,
            "--ledger",
            str(ledger),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(120)
def test_a_worker_starved_by_a_gil_holding_step_commits_nothing_after_takeover(
    backend: Backend, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    store = backend.open()
    store.enqueue(WorkflowTask.new("starving", 1, None, checkpoint_id="s1"))
    hog_n = _gil_hog_size(target_s=4.0)  # the lease is 1 s
    starved = _worker(backend.url, ledger, "starved", "--hog-n", str(hog_n))
    try:
        deadline = time.monotonic() + 30
        while not ledger.exists():  # the starved worker is in its step
            assert time.monotonic() < deadline, "the starved worker never started its step"
            time.sleep(0.02)
        expires = store.get_task("s1").lease_expires
        assert expires is not None
        while store.now() <= expires:  # its lease has expired by store time
            assert time.monotonic() < deadline, "store time never passed the starved worker's lease"
            time.sleep(0.05)
        rescuer = _worker(backend.url, ledger, "rescuer", "--until-completed-s", "30")
        rescued, _ = rescuer.communicate(timeout=60)
        starved_out, _ = starved.communicate(timeout=60)
    finally:
        starved.kill()
        starved.wait()
    assert json.loads(rescued) == {"outcome": "completed"}
    assert json.loads(starved_out) == {"outcome": "lease_lost"}
    record = store.get_task("s1")
    assert record.state is TaskState.TERMINAL and record.result == ["hogged", "after"]
    runs = [line.split() for line in ledger.read_text().splitlines()]
    assert [(call, token) for call, _pid, token in runs] == [("hog#1", "1"), ("hog#1", "2"), ("after#1", "2")]
    # Nothing after the takeover carries the starved worker's token.
    history = store.history("s1")
    takeover = next(i for i, e in enumerate(history) if e.kind == "claimed" and e.fencing_token == 2)
    assert all(e.fencing_token != 1 for e in history[takeover:])
