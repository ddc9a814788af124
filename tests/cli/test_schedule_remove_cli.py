"""``schedule remove NAME`` and the ``schedules`` flag for a schedule no live worker
declares, on SQLite and PostgreSQL, around a real pool (``python -m runifold_sync run``
with ``tests.system.schedule_app``): declared while the pool runs, flagged once it
stopped, removed with its tick tasks kept, and an unknown name an error naming it."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from click.testing import CliRunner

from runifold_sync.cli.main import main
from tests.support import processes
from tests.support.backends import Backend

APP = "tests.system.schedule_app:registry"
AUDIT = ("--actor", "alice", "--reason", "report retired")


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _listed(url: str) -> dict[str, dict[str, object]]:
    code, out = _invoke("schedules", "--database", url, "--json")
    assert code == 0, out
    return {s["name"]: s for s in json.loads(out)}


@pytest.mark.timeout(120)
def test_a_schedule_no_live_worker_declares_is_flagged_and_removed_with_its_ticks_kept(
    backend: Backend,
) -> None:
    store = backend.open()
    store.migrate()
    url = backend.url
    command = ["run", "--app", APP, "--database", url, "--concurrency", "1"]
    with processes.reaped() as started:
        pool = processes.spawn("runifold_sync", *command, own_session=True, stdout=subprocess.DEVNULL)
        started.append(pool)
        processes.wait_until(
            lambda: any(t.task_id.startswith("schedule:every-second:") for t in store.list_tasks()),
            60,
            "the pool to create an every-second tick",
        )
        listed = _listed(url)
        assert {name: s["no_live_worker_declares"] for name, s in listed.items()} == {
            "every-second": False,
            "hourly": False,
        }
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=30) == 0
    assert {name: s["no_live_worker_declares"] for name, s in _listed(url).items()} == {
        "every-second": True,
        "hourly": True,
    }
    code, out = _invoke("schedules", "--database", url)
    assert code == 0
    flagged = [line for line in out.splitlines() if line.endswith("[no live worker declares it]")]
    assert [line.split()[0] for line in flagged] == ["every-second", "hourly"]

    ticks = {t.task_id for t in store.list_tasks() if t.task_id.startswith("schedule:every-second:")}
    last = store.schedule("every-second").last_tick
    code, out = _invoke("schedule", "remove", "every-second", *AUDIT, "--database", url, "--json")
    assert code == 0, out
    removed = json.loads(out)
    assert (removed["name"], removed["removed"], removed["next_tick"]) == ("every-second", True, None)
    assert removed["last_tick"] == sorted(ticks)[-1].rpartition("every-second:")[2]
    assert last is not None
    assert list(_listed(url)) == ["hourly"]
    kept = {t.task_id for t in store.list_tasks() if t.task_id.startswith("schedule:every-second:")}
    assert kept == ticks
    code, out = _invoke("schedule", "history", "every-second", "--database", url, "--json")
    assert [(e["kind"], e["actor"]) for e in json.loads(out)][-1] == ("removed", "alice")

    code, out = _invoke("schedule", "remove", "hourly", *AUDIT, "--database", url)
    assert (code, out) == (0, "schedule hourly: removed (last tick none; its ticks' tasks are kept)\n")
    assert _listed(url) == {}
    code, out = _invoke("schedule", "remove", "every-second", *AUDIT, "--database", url)
    assert code == 1 and "no schedule named 'every-second' is stored" in out


def test_schedule_remove_help_says_a_registry_that_still_adds_it_stores_it_again() -> None:
    result = CliRunner().invoke(main, ["schedule", "remove", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Remove schedule NAME's stored state" in text
    assert "stores it again" in text and "any other pool when it starts" in text
    assert "--actor" in text and "--reason" in text
