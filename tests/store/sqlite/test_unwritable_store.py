"""A SQLite store this process may not write: ``run`` stops after a bounded number of
attempts and names the file or directory and why, instead of retrying every 5 s for
ever; reading it still works. Root ignores file permissions, so as root the commands run
without the capabilities that let it (``setpriv``), as any other user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.worker.worker import NOT_WRITABLE_ATTEMPTS
from tests.support.processes import ROOT

APP = "tests.pool.pool_app:registry"
_NO_OVERRIDE = ["--bounding-set=-dac_override,-dac_read_search,-fowner", "--inh-caps=-all"]


def unprivileged(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    """``python -m runifold_sync ARGS`` as this user without permission overrides."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            if os.environ.get("CI"):
                pytest.fail("setpriv (util-linux) is missing: CI must run the permission tests")
            pytest.skip("running as root without setpriv: permissions cannot be applied")
        prefix = [setpriv, *_NO_OVERRIDE]
    return subprocess.run(
        [*prefix, sys.executable, "-m", "runifold_sync", *args],
        cwd=ROOT,
        env=os.environ | {"POOL_LEDGER": os.devnull},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def with_a_task(path: Path) -> str:
    store = SqliteWorkflowStore.open(path)
    store.enqueue(WorkflowTask.new("pool-flow", 1, 1, checkpoint_id="t1"))
    store.close()
    return f"sqlite:///{path}"


@pytest.mark.timeout(120)
def test_run_on_a_file_it_may_not_write_stops_after_bounded_attempts_naming_the_file(tmp_path: Path) -> None:
    url = with_a_task(tmp_path / "workflows.db")
    (tmp_path / "workflows.db").chmod(0o444)
    started = time.monotonic()
    done = unprivileged("run", "--app", APP, "--database", url, "--max-backoff", "0.5", "--json")
    took_s = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-2000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("Error: the pool stopped: worker ")
    assert f"the file '{tmp_path / 'workflows.db'}' is not writable by this process" in last_line
    assert "mode 0444" in last_line
    assert done.stderr.count("cycle failed; backing off") == NOT_WRITABLE_ATTEMPTS - 1
    assert json.loads(done.stdout)["stopped_by"] in last_line
    assert took_s < 30  # five attempts, 0.5 s apart; before, it never ended
    listed = unprivileged("list", "--database", url, "--json")  # reading still works
    assert listed.returncode == 0 and [t["task_id"] for t in json.loads(listed.stdout)] == ["t1"]


@pytest.mark.timeout(60)
def test_run_in_a_directory_it_may_not_write_stops_at_once_naming_the_directory(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    url = with_a_task(folder / "workflows.db")
    folder.chmod(0o555)
    try:
        done = unprivileged("run", "--app", APP, "--database", url)
        created = unprivileged("enqueue", "pool-flow", "1", "--database", f"sqlite:///{folder / 'new.db'}")
    finally:
        folder.chmod(0o755)
    assert done.returncode == 1
    assert f"the directory '{folder}' is not writable by this process" in done.stderr.splitlines()[-1]
    assert "-wal and -shm" in done.stderr.splitlines()[-1]
    assert created.returncode == 1
    assert created.stderr.strip() == (
        f"Error: cannot create SQLite database '{folder / 'new.db'}': the directory '{folder}' is not "
        f"writable by this process (uid {os.geteuid()}); SQLite creates the database's -wal and -shm files "
        "beside it"
    )


@pytest.mark.parametrize(
    ("mode", "denied"), [(0o000, "readable or writable"), (0o200, "readable")], ids=["0000", "0200"]
)
def test_a_file_it_may_not_read_is_said_to_be_unreadable_not_unwritable(
    tmp_path: Path, mode: int, denied: str
) -> None:
    path = tmp_path / "workflows.db"
    url = with_a_task(path)
    path.chmod(mode)
    listed = unprivileged("list", "--database", url)
    assert listed.returncode == 1
    assert listed.stderr.splitlines()[-1] == (
        f"Error: cannot open SQLite database '{path}': unable to open database file (the file "
        f"'{path}' is not {denied} by this process (uid {os.geteuid()}, mode {mode:04o}))"
    )
