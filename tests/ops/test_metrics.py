"""What ``PrometheusObserver`` records for each kind of cycle, and the store gauges
``StoreCollector`` computes at scrape time, read from a registry of the test's own (the
test process is not in multiprocess mode)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument, StoreUnavailable
from runifold_sync.model.flow import FlowLimit
from runifold_sync.ops.metrics import MAX_DEFINITION_LABELS, OTHER, PrometheusObserver, StoreCollector
from runifold_sync.outcomes import Completed, DefinitionUnavailable, Failed, LeaseLost, Retried, Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TenantBudget, TenantPolicy
from runifold_sync.worker.observer import CycleObserver
from tests.support.routing import checkpointed_by_other_steps

LEASE = LeaseDuration(timedelta(seconds=30))


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


Run = Callable[..., Any]


@pytest.fixture
def run(sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry) -> Iterator[Run]:
    """Run one cycle of a worker that serves ``workflows`` and records into ``registry``."""
    observer = PrometheusObserver(registry)
    workers: list[WorkflowWorker] = []

    def run_once(*workflows: Workflow) -> Any:
        if not workers:
            definitions = WorkflowRegistry()
            for workflow in workflows:
                definitions.register(WorkflowDefinition(workflow))
            worker_id = WorkerId.parse("w1")
            workers.append(
                WorkflowWorker(
                    sqlite_store, definitions, worker_id, LEASE, timedelta(seconds=10), observer=observer
                )
            )
        return workers[0].run_once()

    yield run_once
    for worker in workers:
        worker.close()


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _enqueue(store: SqliteWorkflowStore, workflow: Workflow, value: Any = None, **kwargs: Any) -> str:
    return store.enqueue(WorkflowTask.new(workflow.name, workflow.version, value, **kwargs)).task_id


def test_a_completed_cycle_records_its_queue_delay_and_its_duration(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry, run: Run
) -> None:
    wf = Workflow("done", 1)

    @wf.main
    def main(ctx: WorkflowContext, value: int) -> int:
        return value + 1

    _enqueue(sqlite_store, wf, 1)
    sqlite_store.set_clock_offset(timedelta(seconds=7))  # it waited in the queue
    assert isinstance(run(wf), Completed)
    assert _value(registry, "runifold_queue_delay_seconds_count") == 1
    assert _value(registry, "runifold_queue_delay_seconds_sum") >= 7
    assert _value(registry, "runifold_cycle_seconds_count", outcome="completed") == 1
    assert _value(registry, "runifold_cycle_seconds_sum", outcome="completed") > 0
    assert _value(registry, "runifold_wait_seconds_count", kind="timer") == 0  # it never waited


def _failing_step() -> Workflow:
    wf = Workflow("failing-step", 1)

    @wf.step(retry=RetryPolicy(max_attempts=1))
    def boom(ctx: StepContext) -> None:
        raise RuntimeError("customer 4711 not found")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        boom(ctx)

    return wf


def _failing_main() -> Workflow:
    wf = Workflow("failing-main", 1)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        raise KeyError("order-99")

    return wf


def _typed_input() -> Workflow:
    wf = Workflow("typed-input", 1)

    @wf.main
    def main(ctx: WorkflowContext, value: int) -> int:
        return value

    return wf


def _unstorable_result() -> Workflow:
    wf = Workflow("unstorable", 1)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> object:
        return object()

    return wf


@pytest.mark.parametrize(
    ("make", "task_input", "cause"),
    [
        (_failing_step, None, "step_error"),
        (_failing_main, None, "workflow_error"),
        (_typed_input, "not a number", "bad_input"),
        (_unstorable_result, None, "not_serializable"),
    ],
)
def test_failures_are_counted_by_a_fixed_cause_never_by_their_text(
    sqlite_store: SqliteWorkflowStore,
    registry: CollectorRegistry,
    run: Run,
    make: Callable[[], Workflow],
    task_input: Any,
    cause: str,
) -> None:
    wf = make()
    _enqueue(sqlite_store, wf, task_input)
    outcome = run(wf)
    assert isinstance(outcome, Failed) and outcome.cause == cause
    assert _value(registry, "runifold_failures_total", reason=cause) == 1
    assert _value(registry, "runifold_cycle_seconds_count", outcome="failed") == 1
    reasons = {
        sample.labels["reason"]
        for metric in registry.collect()
        if metric.name == "runifold_failures"
        for sample in metric.samples
    }
    assert reasons == {cause}


def test_a_retried_step_counts_as_a_retry(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry, run: Run
) -> None:
    wf = Workflow("flaky", 1)

    @wf.step(retry=RetryPolicy(max_attempts=3))
    def flaky(ctx: StepContext) -> None:
        raise RuntimeError("try again")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        flaky(ctx)

    _enqueue(sqlite_store, wf)
    assert isinstance(run(wf), Retried)
    assert _value(registry, "runifold_retries_total") == 1
    assert _value(registry, "runifold_failures_total", reason="step_error") == 0


def test_a_definition_this_worker_lacks_is_counted_by_name_and_version(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry, run: Run
) -> None:
    # A routed claim takes no version the worker lacks: what it still hands back is a
    # task whose checkpoint other steps wrote, claimed before routing knew its fingerprint.
    checkpointed_by_other_steps(sqlite_store, "failing-main", 1, "t1")
    assert isinstance(run(_failing_main()), DefinitionUnavailable)
    assert (
        _value(registry, "runifold_definition_unavailable_total", definition="failing-main", version="1") == 1
    )


def _series(registry: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [
        sample.labels for metric in registry.collect() for sample in metric.samples if sample.name == name
    ]


def test_definition_labels_from_made_up_names_are_bounded(registry: CollectorRegistry) -> None:
    """300 names no worker knows (anyone who enqueues can make them up) give at most
    MAX_DEFINITION_LABELS series and one more for the rest, counted there."""
    observer = PrometheusObserver(registry)
    claimed: Any = None  # finished() reads nothing of it for this outcome
    for n in range(300):
        observer.finished(claimed, DefinitionUnavailable(f"t{n}", f"made-up-{n}", 1), 0.01)
    series = _series(registry, "runifold_definition_unavailable_total")
    assert len(series) == MAX_DEFINITION_LABELS + 1
    assert _value(registry, "runifold_definition_unavailable_total", definition=OTHER, version=OTHER) == 250
    assert _value(registry, "runifold_definition_unavailable_total", definition="made-up-0", version="1") == 1


def test_unserved_version_gauges_from_made_up_names_are_bounded(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry
) -> None:
    registry.register(StoreCollector(sqlite_store))
    sqlite_store.enqueue_many([WorkflowTask.new(f"made-up-{n}", 1, None) for n in range(300)])
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 2, n) for n in range(3)])
    series = _series(registry, "runifold_unserved_tasks")
    assert len(series) == MAX_DEFINITION_LABELS + 1
    assert (
        _value(registry, "runifold_unserved_tasks", definition="orders", version="2") == 3
    )  # the largest kept
    assert _value(registry, "runifold_unserved_tasks", definition=OTHER, version=OTHER) == 300 - (
        MAX_DEFINITION_LABELS - 1
    )


def test_unserved_ready_route_gauges_from_made_up_names_are_bounded(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry
) -> None:
    registry.register(StoreCollector(sqlite_store))
    sqlite_store.enqueue_many([WorkflowTask.new(f"made-up-{n}", 1, None) for n in range(300)])
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 2, n, queue="billing") for n in range(3)])
    name = "runifold_unserved_ready_tasks"
    assert len(_series(registry, name)) == MAX_DEFINITION_LABELS + 1
    assert _value(registry, name, queue="billing", definition="orders", version="2") == 3  # the largest kept
    assert _value(registry, name, queue=OTHER, definition=OTHER, version=OTHER) == 300 - (
        MAX_DEFINITION_LABELS - 1
    )


def test_a_lost_lease_is_counted(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry, run: Run
) -> None:
    wf = Workflow("outlived", 1)

    @wf.step()
    def slow(ctx: StepContext) -> None:
        sqlite_store.set_clock_offset(LEASE.value + timedelta(seconds=1))  # the step outlives its lease
        sqlite_store.claim(WorkerId.parse("other"), LEASE)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        slow(ctx)

    _enqueue(sqlite_store, wf)
    assert isinstance(run(wf), LeaseLost)
    assert _value(registry, "runifold_lease_losses_total") == 1
    assert _value(registry, "runifold_cycle_seconds_count", outcome="lease_lost") == 1


def test_a_resumed_wait_records_how_long_it_waited_by_kind(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry, run: Run
) -> None:
    wf = Workflow("waits", 1, signals=["go"])

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        ctx.sleep(timedelta(seconds=60))
        ctx.wait_for_signal("go")

    task_id = _enqueue(sqlite_store, wf)
    assert isinstance(run(wf), Suspended)
    sqlite_store.set_clock_offset(timedelta(seconds=90))  # the timer came due 30 s ago
    assert isinstance(run(wf), Suspended)
    assert _value(registry, "runifold_wait_seconds_count", kind="timer") == 1
    assert _value(registry, "runifold_wait_seconds_sum", kind="timer") >= 90

    sqlite_store.set_clock_offset(timedelta(seconds=100))
    sqlite_store.send_signal(task_id, "go", None, signal_id="s1", sender="ops")
    assert isinstance(run(wf), Completed)
    assert _value(registry, "runifold_wait_seconds_count", kind="signal") == 1
    assert 10 <= _value(registry, "runifold_wait_seconds_sum", kind="signal") < 90
    assert _value(registry, "runifold_queue_delay_seconds_count") == 3


def test_the_worker_refuses_an_observer_of_another_kind(sqlite_store: SqliteWorkflowStore) -> None:
    with pytest.raises(InvalidArgument, match="CycleObserver"):
        WorkflowWorker(
            sqlite_store,
            WorkflowRegistry(),
            WorkerId.parse("w1"),
            LEASE,
            timedelta(seconds=10),
            observer=object(),  # type: ignore[arg-type]
        )
    assert isinstance(PrometheusObserver(CollectorRegistry()), CycleObserver)


# --- store gauges ---------------------------------------------------------------------------


def test_store_gauges_count_tasks_per_tenant_and_state_and_unserved_versions(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry
) -> None:
    registry.register(StoreCollector(sqlite_store))
    for n in range(3):
        sqlite_store.enqueue(WorkflowTask.new("orders", 2, n, tenant="acme"))
    sqlite_store.enqueue(WorkflowTask.new("orders", 2, 9, tenant="globex"))
    sqlite_store.set_clock_offset(timedelta(seconds=12))

    assert _value(registry, "runifold_store_up") == 1
    assert _value(registry, "runifold_tasks", tenant="acme", state="queued", outcome="") == 3
    assert _value(registry, "runifold_tasks", tenant="globex", state="queued", outcome="") == 1
    assert _value(registry, "runifold_oldest_ready_age_seconds", tenant="acme", state="queued") >= 12
    assert _value(registry, "runifold_unserved_tasks", definition="orders", version="2") == 4

    sqlite_store.register_worker(WorkerId.parse("w1"), host="h", pid=1, definitions=[("orders", 2)])
    assert _value(registry, "runifold_unserved_tasks", definition="orders", version="2") == 0


def test_store_gauges_count_ready_tasks_deferred_by_tenant_admission(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry
) -> None:
    registry.register(StoreCollector(sqlite_store))
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 2, n, tenant="acme") for n in range(3)])
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 2, n, tenant="globex") for n in range(2)])
    sqlite_store.set_tenant_policy(TenantPolicy("acme", max_leased=0))
    sqlite_store.set_tenant_policy(TenantPolicy("globex", budget=TenantBudget(0, timedelta(hours=1))))
    assert _value(registry, "runifold_admission_deferred_tasks", tenant="acme", admission="tenant_limit") == 3
    assert _value(registry, "runifold_admission_deferred_tasks", tenant="acme", admission="budget") == 0
    assert _value(registry, "runifold_admission_deferred_tasks", tenant="globex", admission="budget") == 2
    sqlite_store.set_tenant_policy(TenantPolicy("acme", max_leased=5))
    assert _value(registry, "runifold_admission_deferred_tasks", tenant="acme", admission="tenant_limit") == 0


def test_store_gauges_show_each_flow_groups_running_limit_and_waiting(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry
) -> None:
    registry.register(StoreCollector(sqlite_store))
    sqlite_store.set_flow_limit(FlowLimit("key", "acct-*", max_running=1))
    sqlite_store.enqueue_many(
        [WorkflowTask.new("orders", 2, n, checkpoint_id=f"t{n}", concurrency_key="acct-1") for n in range(3)]
    )
    sqlite_store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), limit=3)
    assert _value(registry, "runifold_flow_running_tasks", scope="key", group="acct-1") == 1
    assert _value(registry, "runifold_flow_max_running", scope="key", group="acct-1") == 1
    assert _value(registry, "runifold_flow_waiting_tasks", scope="key", group="acct-1") == 2


def test_a_store_that_cannot_answer_reports_down_instead_of_failing_the_scrape(
    sqlite_store: SqliteWorkflowStore, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.register(StoreCollector(sqlite_store))

    def unavailable() -> None:
        raise StoreUnavailable("database restarting")

    monkeypatch.setattr(sqlite_store, "queue_stats", unavailable)
    assert _value(registry, "runifold_store_up") == 0
    assert (
        registry.get_sample_value("runifold_tasks", {"tenant": "default", "state": "queued", "outcome": ""})
        is None
    )
