"""Named queues on the command line: ``enqueue --queue``, ``run --queue`` (repeatable, or
``$RUNIFOLD_QUEUES``), ``list --queue``, and ``stats``/``show`` naming the queue no live
worker serves; ``run`` reading ``$RUNIFOLD_CLAIM_BATCH`` too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import WorkerId
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore

APP = "tests.pool.pool_app:registry"


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
    note = json.loads(out)["status_note"]
    assert note.startswith("ready since") and note.endswith("waiting for a free worker")  # host-a-0 is live


def _run_once(url: str, *options: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner(env=env).invoke(
        main, ["run", "--app", APP, "--database", url, "--once", "--json", *options], catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def _enqueue_on_queues(url: str, *tasks: tuple[str, str]) -> None:
    for task_id, queue in tasks:
        args = ("--input", "1", "--checkpoint-id", task_id, "--queue", queue, "--database", url)
        code, _ = _invoke("enqueue", "pool-flow", "1", *args)
        assert code == 0


def test_run_reads_the_queues_from_RUNIFOLD_QUEUES_split_at_commas(url: str) -> None:
    _enqueue_on_queues(url, ("d1", "default"), ("g1", "gpu"))
    code, out, _ = _run_once(url, env={"RUNIFOLD_QUEUES": "gpu, render"})
    assert code == 0 and json.loads(out)["task_id"] == "g1"
    code, out = _invoke("workers", "--database", url, "--json")
    assert [w["queues"] for w in json.loads(out)] == [["gpu", "render"]]


def test_run_queue_option_wins_over_RUNIFOLD_QUEUES(url: str) -> None:
    _enqueue_on_queues(url, ("d1", "default"), ("g1", "gpu"))
    code, out, _ = _run_once(url, "--queue", "default", env={"RUNIFOLD_QUEUES": "gpu"})
    assert code == 0 and json.loads(out)["task_id"] == "d1"


def test_run_refuses_a_bad_RUNIFOLD_QUEUES_as_a_usage_error_naming_it(url: str) -> None:
    code, out, err = _run_once(url, env={"RUNIFOLD_QUEUES": "gpu,,render"})
    assert code == 2 and "RUNIFOLD_QUEUES" in err and "'gpu,,render'" in err


def test_run_reads_the_claim_batch_from_RUNIFOLD_CLAIM_BATCH(url: str) -> None:
    for task_id in ("t1", "t2"):
        _invoke("enqueue", "pool-flow", "1", "--input", "1", "--checkpoint-id", task_id, "--database", url)
    code, out, _ = _run_once(url, env={"RUNIFOLD_CLAIM_BATCH": "2"})
    assert code == 0 and json.loads(out)["task_id"] == "t1"
    # t2 was claimed with t1 in a batch of two, and handed back when the --once cycle ended.
    code, out = _invoke("show", "t2", "--database", url, "--json")
    assert "handed back unstarted" in json.loads(out)["reason"]


@pytest.mark.parametrize("how", ["option", "variable"])
def test_run_takes_claim_batch_auto_and_claims_one_task_at_first(url: str, how: str) -> None:
    for task_id in ("t1", "t2"):
        _invoke("enqueue", "pool-flow", "1", "--input", "1", "--checkpoint-id", task_id, "--database", url)
    options, env = (
        (("--claim-batch", "auto"), {}) if how == "option" else ((), {"RUNIFOLD_CLAIM_BATCH": "auto"})
    )
    code, out, _ = _run_once(url, *options, env=env)
    assert code == 0 and json.loads(out)["task_id"] == "t1"
    code, out = _invoke("show", "t2", "--database", url, "--json")
    assert json.loads(out)["state"] == "queued" and "handed back" not in (json.loads(out)["reason"] or "")


def test_run_refuses_a_bad_claim_batch_option_as_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["run", "--app", APP, "--once", "--claim-batch", "lots"])
    assert result.exit_code == 2 and "'lots'" in result.output


def test_run_refuses_a_bad_RUNIFOLD_CLAIM_BATCH_as_a_usage_error_naming_it(url: str) -> None:
    code, _, err = _run_once(url, env={"RUNIFOLD_CLAIM_BATCH": "abc"})
    assert code == 2 and "RUNIFOLD_CLAIM_BATCH" in err and "'abc'" in err


def test_run_help_names_the_variables() -> None:
    out = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    assert "[env var: RUNIFOLD_QUEUES]" in out and "[env var: RUNIFOLD_CLAIM_BATCH]" in out


def test_run_refuses_a_queue_option_holding_a_comma(url: str) -> None:
    code, out, err = _run_once(url, "--queue", "gpu,default", env={})
    assert code == 2 and "'gpu,default'" in err and "--queue gpu --queue default" in err
