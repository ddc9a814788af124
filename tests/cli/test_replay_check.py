"""The deploy gate: ``versions --app NEW --replay`` replays every run in flight against
the new code, running no step body, and exits 1 naming each run that would diverge (the
call recorded and the call the new code makes); a change guarded by ``ctx.patched``
passes, a reordered step does not. ``versions`` lists the patches each run has recorded."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

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
from runifold_sync.errors import InvalidArgument, NonDeterminism, UnknownDefinition
from runifold_sync.outcomes import Suspended
from runifold_sync.testing import replay
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RAN: Counter[str] = Counter()


def order(change: str) -> Workflow:
    """``order`` v1: reserve, bill, wait, ship. ``change``: "none"; "patched" adds an
    audit between reserve and bill behind a patch; "reordered" bills before reserving;
    "unguarded" adds the audit without a patch (declared with patch= so the fingerprint
    stays, which only the replay can catch)."""
    workflow = Workflow("order", 1)

    @workflow.step()
    def reserve(ctx: StepContext, n: int) -> int:
        RAN["reserve"] += 1
        return n

    @workflow.step()
    def bill(ctx: StepContext, n: int) -> int:
        RAN["bill"] += 1
        return n

    @workflow.step()
    def ship(ctx: StepContext, n: int) -> str:
        RAN["ship"] += 1
        return f"shipped {n}"

    @workflow.step(patch="audit")
    def audit(ctx: StepContext, n: int) -> int:
        RAN["audit"] += 1
        return n

    @workflow.main
    def run(ctx: WorkflowContext, n: int) -> str:
        if change == "reordered":
            n = bill(ctx, n)
            n = reserve(ctx, n)
        else:
            n = reserve(ctx, n)
            if change == "patched" and ctx.patched("audit"):
                n = audit(ctx, n)
            elif change == "unguarded":
                n = audit(ctx, n)
            n = bill(ctx, n)
        ctx.sleep(timedelta(hours=1))
        return ship(ctx, n)

    return workflow


def registry_of(change: str) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(order(change)))
    return registry


patched_app = registry_of("patched")
reordered_app = registry_of("reordered")
unguarded_app = registry_of("unguarded")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def in_flight(store: WorkflowStore, code: str, ids: list[str]) -> None:
    worker = WorkflowWorker(
        store, registry_of(code), WorkerId.parse(f"w-{code}"), LeaseDuration(timedelta(seconds=30))
    )
    for task_id in ids:
        store.enqueue(WorkflowTask.new("order", 1, 7, checkpoint_id=task_id))
        assert isinstance(worker.run_once(), Suspended)
    worker.close()


def versions(backend: Backend, app: str, *extra: str) -> tuple[int, str]:
    done = CliRunner().invoke(
        main,
        ["versions", "--app", f"tests.cli.test_replay_check:{app}", "--database", backend.url, *extra],
    )
    return done.exit_code, done.output


def test_the_replay_check_passes_a_patched_change_and_runs_nothing(
    backend: Backend, store: WorkflowStore
) -> None:
    in_flight(store, "none", ["o1", "o2"])
    RAN.clear()
    code, output = versions(backend, "patched_app", "--replay", "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["replay"] == {"checked": 2, "diverged": []}
    assert not RAN  # no step body ran
    # Each run in flight lacks the app's patch "audit": listed per task.
    [listed] = report["patches"]
    assert listed["patches"] == ["audit"]
    assert {(t["task_id"], tuple(t["recorded"]), tuple(t["missing"])) for t in listed["tasks"]} == {
        ("o1", (), ("audit",)),
        ("o2", (), ("audit",)),
    }


def test_the_replay_check_catches_a_reordered_step_naming_both_calls(
    backend: Backend, store: WorkflowStore
) -> None:
    in_flight(store, "none", ["o3"])
    RAN.clear()
    code, output = versions(backend, "reordered_app", "--replay", "--json")
    assert code == 1, output
    [finding] = json.loads(output)["replay"]["diverged"]
    assert (finding["task_id"], finding["position"]) == ("o3", 0)
    assert finding["recorded"] == "step reserve#1" and finding["new"] == "bill#1"
    assert not RAN
    code, text = versions(backend, "reordered_app", "--replay")
    assert code == 1 and "DIVERGES o3" in text and "recorded step reserve#1, new code bill#1" in text
    code, output = versions(backend, "unguarded_app", "--replay", "--json")
    assert code == 1
    [finding] = json.loads(output)["replay"]["diverged"]
    assert finding["recorded"] == "step bill#1" and finding["new"] == "audit#1"


def test_a_run_that_recorded_a_patch_is_listed_with_it_and_diverges_from_code_without_it(
    backend: Backend, store: WorkflowStore
) -> None:
    in_flight(store, "patched", ["p1"])
    in_flight(store, "none", ["p0"])
    code, output = versions(backend, "patched_app", "--replay", "--json")
    assert code == 0, output
    [listed] = json.loads(output)["patches"]
    by_task = {t["task_id"]: (t["recorded"], t["missing"]) for t in listed["tasks"]}
    assert by_task == {"p1": (["audit"], []), "p0": ([], ["audit"])}
    code, output = versions(backend, "reordered_app", "--replay", "--json")
    assert code == 1
    found = {f["task_id"]: f for f in json.loads(output)["replay"]["diverged"]}
    assert set(found) == {"p0", "p1"}
    text = CliRunner().invoke(main, ["versions", "--database", backend.url]).output
    assert "order v1 patches: audit" in text and "p1 (waiting): recorded audit; not recorded -" in text


def test_replay_needs_an_app(backend: Backend) -> None:
    done = CliRunner().invoke(main, ["versions", "--replay", "--database", backend.url])
    assert done.exit_code == 2 and "--replay needs --app" in done.output


def test_an_exported_run_replays_in_a_test_against_new_code(
    backend: Backend, store: WorkflowStore, tmp_path: Path
) -> None:
    in_flight(store, "none", ["x1"])
    done = CliRunner().invoke(main, ["show", "x1", "--export", "--database", backend.url])
    assert done.exit_code == 0, done.output
    exported = json.loads(done.output)
    assert (exported["task_id"], exported["definition"], exported["version"], exported["input"]) == (
        "x1",
        "order",
        1,
        7,
    )
    assert [e["kind"] for e in exported["history"]][:2] == ["enqueued", "claimed"]
    path = tmp_path / "run.json"
    path.write_text(done.output)
    RAN.clear()
    replay(exported, patched_app)  # the patched change continues it
    replay(path, registry_of("none"))
    replay(str(path), patched_app)
    assert not RAN
    with pytest.raises(NonDeterminism) as caught:
        replay(done.output, reordered_app)
    assert (caught.value.position, caught.value.recorded, caught.value.requested) == (
        0,
        "step reserve#1",
        "bill#1",
    )
    with pytest.raises(UnknownDefinition):
        replay(exported, WorkflowRegistry())
    with pytest.raises(InvalidArgument, match="format"):
        replay({"format": "other"}, patched_app)
