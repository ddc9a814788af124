"""Named queues on the command line: ``enqueue --queue``, ``run --queue`` (repeatable),
``list --queue``, and ``stats``/``show`` naming the queue no live worker serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import WorkerId
from runifold_sync.cli import main
from runifold_sync.sqlite import SqliteWorkflowStore

APP = "tests.integration.pool_app:registry"


@pytest.fixture
def url(sqlite_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def test_run_claims_only_from_the_queues_it_is_given(url: str) -> None:
    for task_id, queue in (("d1", "default"), ("r1", "render"), ("x1", "export")):
        code, _ = _invoke(
            "enqueue",
            "pool-flow",
            "1",
            "--input",
            "1",
            "--checkpoint-id",
            task_id,
            "--queue",
            queue,
            "--database",
            url,
        )
        assert code == 0
    code, out = _invoke("list", "--queue", "render", "--database", url, "--json")
    assert code == 0 and [(t["task_id"], t["queue"]) for t in json.loads(out)] == [("r1", "render")]
    run = (
        "run",
        "--app",
        APP,
        "--database",
        url,
        "--once",
        "--json",
        "--queue",
        "render",
        "--queue",
        "export",
    )
    claimed = set()
    for _ in range(3):
        code, out = _invoke(*run)
        assert code == 0
        claimed.add(json.loads(out).get("task_id"))
    assert claimed == {"r1", "x1", None}  # the third cycle is idle: d1 is not its queue's
    code, out = _invoke("list", "--database", url, "--json")
    states = {t["task_id"]: t["state"] for t in json.loads(out)}
    assert states == {"d1": "queued", "r1": "terminal", "x1": "terminal"}
    code, out = _invoke("workers", "--database", url, "--json")
    assert [w["queues"] for w in json.loads(out)] == [["export", "render"]]


def test_enqueue_is_idempotent_on_the_queue_too(url: str) -> None:
    args = ("enqueue", "pool-flow", "1", "--checkpoint-id", "t1", "--database", url)
    assert _invoke(*args, "--queue", "render")[0] == 0
    assert "already enqueued" in _invoke(*args, "--queue", "render")[1]
    result = CliRunner().invoke(main, [*args], catch_exceptions=False)
    assert result.exit_code == 1 and "queue" in result.output


def test_stats_and_show_name_the_queue_no_live_worker_serves(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "r1", "--queue", "render", "--database", url)
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "d1", "--database", url)
    store = SqliteWorkflowStore.open(url.removeprefix("sqlite:///"))
    store.register_worker(WorkerId.parse("host-a-0"), host="host-a", pid=11, definitions=[("pool-flow", 1)])
    store.close()
    code, out = _invoke("stats", "--database", url)
    assert code == 0
    assert "UNSERVED: queue render, pool-flow v1 (1 tasks): no live worker serves queue 'render'" in out
    assert "queue default" not in out
    code, out = _invoke("show", "r1", "--database", url)
    assert code == 0 and "status: no live worker serves queue 'render'" in out
    code, out = _invoke("show", "d1", "--database", url, "--json")
    assert json.loads(out)["status_note"].startswith("ready since")
