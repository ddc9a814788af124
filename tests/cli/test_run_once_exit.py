"""``run --once`` exit status for every outcome kind, each produced for real by a
cycle of the CLI against a SQLite file: 0 for idle, completed, suspended and retried (the
issue's list), and yielded; 1 for failed, lease lost, definition unavailable and
cancelled, so cron reports them.

Yielded needs a per-claim step limit, which no ``run`` option sets, so it is checked on
``once_succeeded`` (the rule ``run --once`` applies) directly."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, open_store
from runifold_sync.app import once_succeeded
from runifold_sync.cli.main import main
from runifold_sync.outcomes import Yielded
from runifold_sync.store import TaskState
from tests.support.routing import checkpointed_by_other_steps

APP = "tests.cli.outcome_app:registry"


def _enqueue(mode: str) -> Callable[[WorkflowStore], None]:
    def setup(store: WorkflowStore) -> None:
        store.enqueue(WorkflowTask.new("outcome-flow", 1, mode, checkpoint_id="t1"))

    return setup


def _nothing(store: WorkflowStore) -> None:
    pass


def _other_steps(store: WorkflowStore) -> None:
    """A version the worker lacks is never claimed (idle); what it still hands back is a
    task whose checkpoint other steps wrote, claimed before its fingerprint was known."""
    checkpointed_by_other_steps(store, "outcome-flow", 1, "t1")


def _cancelled_while_its_worker_died(store: WorkflowStore) -> None:
    """The cancel reaches a leased task whose worker died; the next claimant stops it."""
    _enqueue("complete")(store)
    (claimed,) = store.claim(WorkerId.parse("dead-worker"), LeaseDuration(timedelta(seconds=30)))
    assert store.cancel(claimed.lease.task_id, actor="ops", reason="customer left") is TaskState.LEASED
    store.set_clock_offset(timedelta(seconds=31))


CASES = [
    ("idle", 0, _nothing),
    ("completed", 0, _enqueue("complete")),
    ("suspended", 0, _enqueue("suspend")),
    ("retried", 0, _enqueue("retry")),
    ("failed", 1, _enqueue("fail")),
    ("lease_lost", 1, _enqueue("lose_lease")),
    ("definition_unavailable", 1, _other_steps),
    ("cancelled", 1, _cancelled_while_its_worker_died),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "status", "setup"), CASES, ids=[c[0] for c in CASES])
def test_run_once_exit_status_for_each_outcome_kind(
    sqlite_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    status: int,
    setup: Callable[[WorkflowStore], None],
) -> None:
    url = f"sqlite:///{sqlite_path}"
    monkeypatch.setenv("OUTCOME_DATABASE_URL", url)
    store = open_store(url)
    setup(store)
    result = CliRunner().invoke(
        main, ["run", "--app", APP, "--database", url, "--once", "--json"], catch_exceptions=False
    )
    printed = json.loads(result.output)
    assert (printed["outcome"], result.exit_code) == (kind, status)
    if kind != "idle":
        assert printed["task_id"] == "t1"
    store.close()


def test_yielded_counts_as_success_for_run_once() -> None:
    assert once_succeeded(Yielded("t1"))
