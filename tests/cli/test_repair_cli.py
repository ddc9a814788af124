"""The repair commands on every store: ``fork`` (refused by --app when the app would not
continue it), ``resume`` of a cancelled task, ``retry``/``cancel`` by filter with
``--dry-run`` and progress, and ``upgrade NAME --from 1 --to 2``, which moves the runs
that replay cleanly against version 2 and leaves and lists the others."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.cli.main import main
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.store import TaskState
from tests.store import test_repairs
from tests.store.test_repairs import FLAGS, RAN
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

APP = "tests.cli.test_repair_cli"


def trip(version: int) -> Workflow:
    """``trip`` v1: book, wait for "go", pay. v2 checks a large trip (n >= 100) before the
    wait, and notifies at the end: a v1 run of a small trip waiting for "go" replays
    cleanly against it, one of a large trip does not."""
    flow = Workflow("trip", version, signals=["go"])

    @flow.step()
    def book(ctx: StepContext, n: int) -> int:
        return n

    @flow.step()
    def pay(ctx: StepContext, n: int) -> str:
        return f"paid {n} under v{version}"

    if version == 2:

        @flow.step()
        def check(ctx: StepContext, n: int) -> int:
            return n

    @flow.main
    def run(ctx: WorkflowContext, n: int) -> str:
        if version == 3:  # pays first: no journal of an earlier version replays under it
            pay(ctx, n)
        n = book(ctx, n)
        if version == 2 and n >= 100:
            n = check(ctx, n)
        ctx.wait_for_signal("go")
        return pay(ctx, n)

    return flow


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(trip(1)))
registry.register(WorkflowDefinition(trip(2)))
registry.register(WorkflowDefinition(test_repairs.five))
with_v3 = WorkflowRegistry()
with_v3.register(WorkflowDefinition(trip(1)))
with_v3.register(WorkflowDefinition(trip(3)))
v1_only = WorkflowRegistry()
v1_only.register(WorkflowDefinition(trip(1)))


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    FLAGS.clear()
    yield
    RAN.clear()
    FLAGS.clear()


def cli(backend: Backend, *args: str) -> tuple[int, str]:
    done = CliRunner().invoke(main, [*args, "--database", backend.url])
    return done.exit_code, done.stdout if "--json" in args else done.output  # stderr: progress


def worker(store: WorkflowStore, reg: WorkflowRegistry = registry) -> WorkflowWorker:
    return WorkflowWorker(store, reg, WorkerId.parse("cli-repairs"), LeaseDuration(timedelta(seconds=30)))


AUDIT = ("--actor", "ops", "--reason", "repair")


def test_fork_from_the_command_line(backend: Backend, store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="o"))
    w = worker(store)
    assert w.run_once() == Completed("o", 5)
    code, out = cli(
        backend,
        "fork",
        "o",
        "--from-step",
        "s4",
        "--task-id",
        "o2",
        "--app",
        f"{APP}:registry",
        *AUDIT,
        "--json",
    )
    assert code == 0, out
    assert json.loads(out) == {"task_id": "o2", "forked_from": "o", "from_step": "s4"}
    assert w.run_once() == Completed("o2", 5)
    w.close()
    assert RAN[("o2", "s3")] == 0 and RAN[("o2", "s4")] == 1
    code, out = cli(backend, "fork", "o", "--from-step", "nope", *AUDIT)
    assert code != 0 and "recorded no call 'nope#1'" in out


def test_resume_a_cancelled_task_from_the_command_line(backend: Backend, store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("trip", 1, 5, checkpoint_id="t"))
    w = worker(store)
    assert isinstance(w.run_once(), Suspended)
    assert cli(backend, "cancel", "t", *AUDIT)[0] == 0
    code, out = cli(backend, "resume", "t", *AUDIT, "--json")
    assert code == 0 and json.loads(out)["state"] == "queued", out
    store.send_signal("t", "go", None, signal_id="go-t", sender="ops")
    while store.get_task("t").state is not TaskState.TERMINAL:
        w.run_once()
    w.close()
    assert store.get_task("t").result == "paid 5 under v1"


def test_retry_and_cancel_by_filter_from_the_command_line(backend: Backend, store: WorkflowStore) -> None:
    FLAGS["fail_s5"] = True
    store.enqueue_many([WorkflowTask.new("five", 1, n, checkpoint_id=f"f{n}") for n in range(7)])
    w = worker(store)
    for _ in range(7):
        assert isinstance(w.run_once(), Failed)
    code, out = cli(
        backend,
        "retry",
        "--definition",
        "five",
        "--reason-contains",
        "s5 broke",
        "--dry-run",
        *AUDIT,
        "--json",
    )
    assert code == 0, out
    dry = json.loads(out)
    assert (dry["dry_run"], dry["matched"], dry["changed"], dry["first"]) == (
        True,
        7,
        0,
        [f"f{n}" for n in range(7)],
    )
    done = CliRunner().invoke(
        main,
        ["retry", "--definition", "five", "--since", "1h", "--batch", "3", *AUDIT, "--database", backend.url],
    )
    assert done.exit_code == 0, done.output
    assert "7 matched, 7 requeued, 0 skipped" in done.output
    assert "retry: 3/7 looked at" in done.stderr and "retry: 7/7 looked at" in done.stderr
    code, out = cli(backend, "cancel", "--definition", "five", "--state", "queued", *AUDIT, "--json")
    assert code == 0 and json.loads(out)["changed"] == 7, out
    w.close()
    code, out = cli(backend, "retry", "f1", "--definition", "five", *AUDIT)
    assert code == 2 and "task ids or a filter, not both" in out
    code, out = cli(backend, "retry", *AUDIT)
    assert code == 2 and "one TASK_ID, or filter options" in out
    code, out = cli(backend, "retry", "--definition", "five", "--version", "0", *AUDIT)
    assert code != 0 and "filter version" in out


def test_upgrade_moves_the_runs_that_replay_cleanly_and_lists_the_others(
    backend: Backend, store: WorkflowStore
) -> None:
    store.enqueue_many([WorkflowTask.new("trip", 1, n, checkpoint_id=f"trip{n}") for n in (1, 2, 150)])
    old = worker(store, v1_only)
    for _ in range(3):
        assert isinstance(old.run_once(), Suspended)
    old.close()
    code, out = cli(
        backend,
        "upgrade",
        "trip",
        "--from",
        "1",
        "--to",
        "2",
        "--app",
        f"{APP}:registry",
        "--dry-run",
        *AUDIT,
        "--json",
    )
    assert code == 1
    dry = json.loads(out)
    assert dry["moved"] == ["trip1", "trip2"] and [k["task_id"] for k in dry["kept"]] == ["trip150"]
    assert store.get_task("trip1").definition_version == 1  # a dry run moves nothing
    code, out = cli(
        backend, "upgrade", "trip", "--from", "1", "--to", "2", "--app", f"{APP}:registry", *AUDIT
    )
    assert code == 1
    assert "moved 2 task(s) from v1 to v2" in out and "kept trip150 on v1: diverges at call 1" in out
    assert [store.get_task(t).definition_version for t in ("trip1", "trip2", "trip150")] == [2, 2, 1]
    assert [e.detail["to_version"] for e in store.history("trip1") if e.kind == "upgraded"] == [2]
    new = worker(store)
    for task_id in ("trip1", "trip2", "trip150"):
        store.send_signal(task_id, "go", None, signal_id=f"go-{task_id}", sender="ops")
    for _ in range(3):
        assert isinstance(new.run_once(), Completed)
    new.close()
    assert [store.get_task(t).result for t in ("trip1", "trip2", "trip150")] == [
        "paid 1 under v2",
        "paid 2 under v2",
        "paid 150 under v1",
    ]
    code, out = cli(backend, "versions", "--json")
    assert code == 0 and json.loads(out)["referenced"] == []  # v1 can now be dropped


def test_fork_onto_a_newer_version_is_replayed_first(backend: Backend, store: WorkflowStore) -> None:
    store.enqueue_many([WorkflowTask.new("trip", 1, n, checkpoint_id=f"v1-{n}") for n in (7, 170)])
    old = worker(store, v1_only)
    for _ in range(2):
        assert isinstance(old.run_once(), Suspended)
    old.close()
    args = ("--from-step", "signal:go", "--app", f"{APP}:registry", "--to-version", "2", *AUDIT)
    code, out = cli(backend, "fork", "v1-7", "--task-id", "v2-7", *args)
    assert code == 0, out
    record = store.get_task("v2-7")
    assert (record.definition_version, record.fingerprint) == (2, trip(2).fingerprint())
    code, out = cli(backend, "fork", "v1-170", "--task-id", "v2-170", *args)
    assert code == 0, out  # v2 replays book, then checks the large trip anew
    v3 = ("--from-step", "signal:go", "--app", f"{APP}:with_v3", "--to-version", "3", *AUDIT)
    code, out = cli(backend, "fork", "v1-170", "--task-id", "v3-170", *v3)
    assert code == 1 and "would not continue the fork" in out and "pay#1" in out, out
    assert "v3-170" not in [t.task_id for t in store.list_tasks(definition="trip")]
    new = worker(store)
    assert isinstance(new.run_once(), Suspended)  # v2-7 replays book, waits for go
    assert isinstance(new.run_once(), Suspended)  # v2-170 replays book, checks, waits
    store.send_signal("v2-7", "go", None, signal_id="go-v2-7", sender="ops")
    assert new.run_once() == Completed("v2-7", "paid 7 under v2")
    new.close()
    code, out = cli(backend, "fork", "v1-7", "--to-version", "2", "--from-step", "book", *AUDIT)
    assert code == 2 and "--to-version needs --app" in out
