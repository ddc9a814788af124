"""A step that holds the GIL past its lease starves the heartbeat thread. Another worker
takes the task over and still holds it, in a step, when the starved worker wakes: the
starved worker's lease extension then meets the new owner's live lease and is refused
by the fencing token alone, and the starved worker commits nothing. On both stores: a
SQLite file, and a fresh PostgreSQL database."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.store import TaskState
from tests.support import ledger as ledger_file
from tests.support import processes
from tests.support.backends import Backend

WAIT_S = 60.0


def _worker(
    url: str, ledger: Path, worker_id: str, *extra: str, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[str]:
    args = ["--url", url, "--worker-id", worker_id, "--ledger", str(ledger), *extra]
    return processes.spawn("tests.worker.starve_app", *args, stderr=subprocess.PIPE, pass_fds=pass_fds)


def _runs(ledger: Path) -> list[tuple[str, str]]:
    """(call id, fencing token) of every step body that started, in order."""
    return [(call, token) for call, _pid, token in ledger_file.read(ledger)]


def _wait(condition: Callable[[], bool], what: str) -> None:
    processes.wait_until(condition, WAIT_S, what)


def _log_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@pytest.mark.timeout(150)
def test_a_starved_worker_wakes_into_a_live_newer_lease_and_its_write_is_refused_by_the_fence(
    backend: Backend, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    release_rescuer = tmp_path / "release-rescuer"
    store = backend.open()
    store.enqueue(WorkflowTask.new("starving", 1, None, checkpoint_id="s1"))
    gil_read, gil_write = os.pipe()
    starved = _worker(backend.url, ledger, "starved", "--hold-gil-fd", str(gil_read), pass_fds=(gil_read,))
    os.close(gil_read)
    rescuer = None
    try:
        _wait(lambda: _runs(ledger) == [("hog#1", "1")], "the starved worker never started its step")
        expires = store.get_task("s1").lease_expires
        assert expires is not None
        _wait(lambda: store.now() > expires, "store time never passed the starved worker's lease")
        rescuer = _worker(
            backend.url, ledger, "rescuer", "--hold-until", str(release_rescuer), "--until-completed-s", "60"
        )
        _wait(lambda: ("hog#1", "2") in _runs(ledger), "the rescuer never took the task over")
        os.write(gil_write, b"x")  # the starved worker's C call returns; the rescuer holds on
        starved_out, starved_err = starved.communicate(timeout=WAIT_S)

        # While the starved worker woke and wrote, the task was leased, live, to the
        # rescuer: the state and the expiry admitted a write, only the token refused it.
        record = store.get_task("s1")
        assert (record.state, record.worker_id, record.fencing_token) == (TaskState.LEASED, "rescuer", 2)
        assert record.lease_expires is not None and record.lease_expires > store.now()
        release_rescuer.touch()
        rescued, _ = rescuer.communicate(timeout=WAIT_S)
    finally:
        os.close(gil_write)
        for proc in (starved, rescuer):
            if proc is not None:
                processes.kill(proc)

    assert json.loads(starved_out) == {"outcome": "lease_lost", "fencing_token": 1}
    # The starved heartbeat thread's lease extension reached the store and was refused.
    refused = [line for line in _log_lines(starved_err) if line["message"] == "lease lost"]
    assert [(line["task_id"], line["fencing_token"]) for line in refused] == [("s1", 1)]
    assert json.loads(rescued) == {"outcome": "completed", "fencing_token": None}
    record = store.get_task("s1")
    assert record.state is TaskState.TERMINAL and record.result == ["hogged", "after"]
    assert _runs(ledger) == [("hog#1", "1"), ("hog#1", "2"), ("after#1", "2")]
    # The rescuer's lease held throughout (two claims only), and nothing after the
    # takeover carries the starved worker's token.
    history = store.history("s1")
    claims = [e for e in history if e.kind == "claimed"]
    assert [(e.fencing_token, e.worker_id) for e in claims] == [(1, "starved"), (2, "rescuer")]
    # Taken over from an expired lease: the starved worker's heartbeat never ran meanwhile.
    assert claims[1].detail == {"from_state": "leased", "expired_owner": "starved"}
    takeover = next(i for i, e in enumerate(history) if e.kind == "claimed" and e.fencing_token == 2)
    assert all(e.fencing_token != 1 for e in history[takeover:])
