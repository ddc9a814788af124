"""``wait TASK --timeout D``: the exit code says how the task ended (0 completed, 1 failed
or cancelled, 2 still unfinished at the timeout), the text and ``--json`` say the rest;
run as a real process, it is woken by a finish another process commits. ``show`` prints
the events a task published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, open_store
from runifold_sync.cli.main import main
from runifold_sync.store import TaskState
from tests.support.backends import Backend

LEASE = LeaseDuration(timedelta(seconds=30))
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _task(url: str, end: str | None) -> WorkflowStore:
    """Task t1, ended as ``end`` says (None: left queued)."""
    store = open_store(url)
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    if end == "cancelled":
        assert store.cancel("t1", "alice", "not wanted") is TaskState.CANCELLED
    elif end is not None:
        [claimed] = store.claim(WorkerId.parse("w1"), LEASE)
        if end == "completed":
            store.complete(claimed.lease, claimed.revision, "{}", '{"shipped": true}')
        else:
            store.fail(claimed.lease, claimed.revision, None, reason="the card was declined")
    return store


@pytest.mark.parametrize(
    ("end", "code", "said"),
    [
        ("completed", 0, ["t1: completed", 'result: {"shipped": true}']),
        ("failed", 1, ["t1: failed: the card was declined"]),
        ("cancelled", 1, ["t1: cancelled: cancelled by alice: not wanted"]),
    ],
)
def test_wait_exits_with_how_the_task_ended(url: str, end: str, code: int, said: list[str]) -> None:
    _task(url, end).close()
    done = _invoke("wait", "t1", "--timeout", "5s", "--database", url)
    assert (done.exit_code, done.stdout.splitlines()) == (code, said)
    as_json = json.loads(_invoke("wait", "t1", "--database", url, "--json").stdout)
    assert (as_json["task_id"], as_json["timed_out"], as_json["timeout_s"]) == ("t1", False, 30.0)
    assert as_json["outcome"] == (None if end == "cancelled" else end)
    assert as_json["result"] == ({"shipped": True} if end == "completed" else None)


def test_wait_exits_2_when_the_task_is_unfinished_at_the_timeout(url: str) -> None:
    _task(url, None).close()
    started = time.monotonic()
    done = _invoke("wait", "t1", "--timeout", "0.3s", "--database", url)
    assert time.monotonic() - started >= 0.3
    assert done.exit_code == 2
    assert done.stdout.startswith("t1: still queued after 0.3 s (ready since ")
    as_json = json.loads(_invoke("wait", "t1", "--timeout", "0s", "--database", url, "--json").stdout)
    assert (as_json["state"], as_json["timed_out"], as_json["timeout_s"]) == ("queued", True, 0.0)


def test_wait_for_an_unknown_task_or_with_a_bad_timeout_says_so(url: str) -> None:
    _invoke("migrate", "--database", url)
    unknown = _invoke("wait", "nope", "--database", url)
    assert (unknown.exit_code, unknown.stderr) == (1, "Error: no task with id 'nope'\n")
    bad = _invoke("wait", "t1", "--timeout", "soon", "--database", url)
    assert bad.exit_code == 2
    assert "'soon' is not a duration (30s, 5m, 1h30m, 2d)" in bad.stderr


def test_a_waiting_process_is_woken_by_a_finish_another_process_commits(backend: Backend) -> None:
    store = _task(backend.url, None)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    waiting = subprocess.Popen(
        [sys.executable, "-m", "runifold_sync", "wait", "t1", "--timeout", "60s", "--database", backend.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(2.0)  # started, its first reads done: it waits
        assert waiting.poll() is None
        [claimed] = store.claim(WorkerId.parse("w1"), LEASE)
        store.complete(claimed.lease, claimed.revision, "{}", '"done"')
        completed_at = time.monotonic()
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
        store.close()
    assert (waiting.returncode, out) == (0, 't1: completed\nresult: "done"\n'), err
    assert time.monotonic() - completed_at < 1.5  # the process exit included


def test_show_prints_the_events_a_task_published(url: str) -> None:
    _invoke("enqueue", "stages", "1", "--input", '"o-1"', "--checkpoint-id", "t1", "--database", url)
    ran = _invoke("run", "--app", "tests.cli.events_app:registry", "--database", url, "--once")
    assert ran.exit_code == 0, ran.output
    shown = _invoke("show", "t1", "--database", url).stdout.splitlines()
    at = shown.index("events (ctx.set_event, by key):")
    assert shown[at + 1].startswith('  parcel = {"kg":1.5,"label":"packed o-1"} (set 20')
    assert shown[at + 2].startswith('  stage = "packed" (set 20')
    assert shown[at + 3] == "history:"
    as_json = json.loads(_invoke("show", "t1", "--database", url, "--json").stdout)
    assert [(e["key"], e["value"]) for e in as_json["events"]] == [
        ("parcel", {"kg": 1.5, "label": "packed o-1"}),
        ("stage", "packed"),
    ]
    assert all(e["set_at"].startswith("20") for e in as_json["events"])
