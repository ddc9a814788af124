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
WOKEN_WITHIN_S = 1.5  # a woken wait's answer on an idle machine, well within a process's start


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


def _wait_process(url: str, task_id: str) -> subprocess.Popen[str]:
    """``wait TASK`` run as a process, its output unbuffered: each line reaches the pipe
    as it is printed, not at the exit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "runifold_sync", "wait", task_id, "--timeout", "60s", "--database", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_waiting_process_is_woken_by_a_finish_another_process_commits(backend: Backend) -> None:
    """Timed to the waiting process's first line of output (its exit, which a loaded
    machine stretches, is not the wake), and bounded by what answering costs on this
    machine now: a process started for a task already finished takes from its start to
    its first line the interpreter's start, the imports, the store's opening and one
    read. A woken process has only the read left, so it answers within that (or within
    WOKEN_WITHIN_S on a quick machine); one that is not woken sleeps out its 60 s timeout."""
    store = open_store(backend.url)
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t0"))
    [first] = store.claim(WorkerId.parse("w0"), LEASE)
    store.complete(first.lease, first.revision, "{}", '"done"')
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    started = time.monotonic()
    answering = _wait_process(backend.url, "t0")
    try:
        assert answering.stdout is not None
        assert answering.stdout.readline() == "t0: completed\n"
        answer_s = time.monotonic() - started
        answering.wait(timeout=30)
    finally:
        answering.kill()

    waiting = _wait_process(backend.url, "t1")
    try:
        # Past its first read (twice what a process took to answer): it waits.
        time.sleep(max(2.0, 2 * answer_s))
        assert waiting.poll() is None
        [claimed] = store.claim(WorkerId.parse("w1"), LEASE)
        store.complete(claimed.lease, claimed.revision, "{}", '"done"')
        completed_at = time.monotonic()
        assert waiting.stdout is not None
        said = waiting.stdout.readline()
        woken_s = time.monotonic() - completed_at
        out = waiting.stdout.read()  # what the line's read took ahead too
        waiting.wait(timeout=30)
        assert waiting.stderr is not None
        err = waiting.stderr.read()
    finally:
        waiting.kill()
        store.close()
    assert (waiting.returncode, said + out) == (0, 't1: completed\nresult: "done"\n'), err
    assert woken_s < max(WOKEN_WITHIN_S, answer_s), (woken_s, answer_s)


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
