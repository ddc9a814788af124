"""``App``, the front door, on every store: declaring workflows on it, starting them,
running them here, and what a ``TaskHandle`` reads and does. Each test opens its App on
the backend's URL, as an application names its store."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import App, Budget, LeaseDuration, RetryPolicy, Settings, TaskHandle, WorkflowRegistry
from runifold_sync.errors import (
    EnqueueConflict,
    EventNotFound,
    InputMismatch,
    InvalidArgument,
    SignalNotAccepted,
    TaskFailed,
    TaskNotFound,
    UnknownDefinition,
    WaitTimedOut,
)
from runifold_sync.outcomes import Completed, Failed, Idle, Suspended
from runifold_sync.store import TaskState
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend


@attrs.frozen
class Order:
    order_id: str
    quantity: int


@attrs.frozen
class Receipt:
    order_id: str
    total: int


def _declare(app: App) -> None:
    """An order workflow in two versions, one that waits for a signal and publishes an
    event, one that fails, one that sleeps."""
    v1 = app.workflow("order", version=1)

    @v1.main
    def order_v1(ctx: Any, order: Order) -> Receipt:
        return Receipt(order.order_id, 0)

    v2 = app.workflow("order", version=2)

    @v2.step()
    def price(ctx: Any, quantity: int) -> int:
        return quantity * 5

    @v2.main
    def order_v2(ctx: Any, order: Order) -> Receipt:
        return Receipt(order.order_id, price(ctx, order.quantity))

    waiter = app.workflow("waiter", signals=["go"])

    @waiter.main
    def wait(ctx: Any, _: None) -> str:
        ctx.set_event("ready", {"waiting": True})
        return str(ctx.wait_for_signal("go"))

    failing = app.workflow("failing")

    @failing.step(retry=RetryPolicy(max_attempts=1))
    def explode(ctx: Any) -> None:
        raise ValueError("no stock")

    @failing.main
    def fail(ctx: Any, _: None) -> None:
        explode(ctx)

    sleeper = app.workflow("sleeper")

    @sleeper.main
    def sleep(ctx: Any, name: str) -> str:
        ctx.sleep(timedelta(days=1))
        return f"good morning, {name}"


@pytest.fixture
def app(backend: Backend) -> Any:
    with App(backend.url) as opened:
        _declare(opened)
        yield opened


def test_a_started_task_runs_here_and_its_result_comes_back_as_the_main_functions_type(app: App) -> None:
    task = app.start("order", {"order_id": "o1", "quantity": 3})
    assert isinstance(task, TaskHandle) and app.store.get_task(task.task_id).definition_version == 2
    assert app.run_once() == Completed(task.task_id, {"order_id": "o1", "total": 15})
    assert task.result() == Receipt("o1", 15)
    assert task.result(timeout=timedelta(0)) == Receipt("o1", 15)
    assert task.status().state is TaskState.TERMINAL
    assert app.run_once() == Idle()


def test_start_checks_the_task_against_the_registry_and_stores_nothing_bad(app: App) -> None:
    with pytest.raises(UnknownDefinition, match="Did you mean 'order'"):
        app.start("ordr", {"order_id": "o1", "quantity": 3})
    with pytest.raises(UnknownDefinition, match="'order' has no version 3"):
        app.start("order", {"order_id": "o1", "quantity": 3}, version=3)
    with pytest.raises(InputMismatch, match="input.quantity"):
        app.start("order", {"order_id": "o1", "quantity": "3"})
    assert app.store.list_tasks() == []
    old = app.start("order", {"order_id": "o1", "quantity": 3}, version=1, tenant="acme", queue="slow")
    record = old.status()
    assert (record.definition_version, record.tenant, record.queue) == (1, "acme", "slow")


def test_a_task_id_makes_a_start_idempotent(app: App) -> None:
    first = app.start("order", {"order_id": "o1", "quantity": 3}, task_id="order-o1")
    again = app.start("order", {"order_id": "o1", "quantity": 3}, task_id="order-o1")
    assert first == again and first.task_id == "order-o1"
    with pytest.raises(EnqueueConflict):
        app.start("order", {"order_id": "o1", "quantity": 4}, task_id="order-o1")
    assert [t.task_id for t in app.store.list_tasks()] == ["order-o1"]


def test_a_handle_reads_events_sends_signals_and_waits_for_the_result_another_process_gives(
    app: App, backend: Backend
) -> None:
    task = app.start("waiter", None)
    with pytest.raises(EventNotFound):
        task.event("ready")
    assert isinstance(app.run_once(), Suspended)
    assert task.event("ready") == {"waiting": True}
    with pytest.raises(WaitTimedOut):
        task.result(timeout=timedelta(milliseconds=50))
    with pytest.raises(SignalNotAccepted):
        task.signal("stop", 1)
    # Another process (an App of its own on the same store) sends the signal and runs it,
    # while this one waits for the result.
    other = App(backend.url, registry=app.registry)
    handle = other.handle(task.task_id)
    assert handle.signal("go", "now", signal_id="s1").created
    assert not handle.signal("go", "now", signal_id="s1").created  # delivered once
    runner = threading.Thread(target=other.run_once)
    runner.start()
    try:
        assert task.result(timeout=timedelta(seconds=30)) == "now"
    finally:
        runner.join()
        other.close()


def test_result_raises_task_failed_for_a_failed_or_cancelled_task(app: App) -> None:
    failed = app.start("failing", None)
    assert isinstance(app.run_once(), Failed)
    with pytest.raises(TaskFailed) as why:
        failed.result()
    assert (why.value.task_id, why.value.outcome) == (failed.task_id, "failed")
    assert "no stock" in str(why.value)
    waiting = app.start("waiter", None)
    assert waiting.cancel("the customer left", actor="support") is TaskState.CANCELLED
    with pytest.raises(TaskFailed, match="cancelled: cancelled by support: the customer left"):
        waiting.result()
    with pytest.raises(TaskNotFound):
        app.handle("nobody").status()


def test_run_until_idle_runs_what_is_ready_and_skips_store_time_only_when_asked(app: App) -> None:
    ready = [app.start("order", {"order_id": f"o{n}", "quantity": n}) for n in range(3)]
    sleeping = app.start("sleeper", "ada")
    outcomes = app.run_until_idle()
    assert sorted(o.kind for o in outcomes) == ["completed"] * 3 + ["suspended"]
    assert [t.result() for t in ready] == [Receipt(f"o{n}", n * 5) for n in range(3)]
    assert sleeping.status().state is TaskState.WAITING
    assert [o.kind for o in app.run_until_idle(skip_time=True)] == ["completed"]
    assert sleeping.result() == "good morning, ada"


def test_a_worker_of_the_app_has_its_settings_with_overrides(backend: Backend) -> None:
    lease = LeaseDuration(timedelta(seconds=12))
    with App(backend.url, lease_duration=lease, claim_batch=3) as app:
        _declare(app)
        worker = app.worker("w-1", claim_batch=2)
        try:
            assert (worker.worker_id.value, worker.settings.claim_batch) == ("w-1", 2)
            assert worker.settings.lease_duration == lease
            assert worker.settings.heartbeat_interval == timedelta(seconds=4)
            assert worker.store is app.store
        finally:
            worker.close()
        assert app.settings.worker.claim_batch == 3
        with pytest.raises(InvalidArgument, match="claim_batch must be 'auto' or an integer in 1..100"):
            app.worker(claim_batch=0)


def test_the_store_is_opened_once_per_process_and_reopened_after_close(app: App) -> None:
    store = app.store
    assert app.store is store
    app.close()
    app.close()
    reopened = app.store
    assert reopened is not store
    app.start("order", {"order_id": "o1", "quantity": 1})
    assert [t.definition_name for t in reopened.list_tasks()] == ["order"]


def test_app_settings_come_from_a_url_a_settings_object_keywords_or_the_environment(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNIFOLD_DATABASE_URL", backend.url)
    assert App().settings.database_url == backend.url
    assert App(Settings(backend.url), concurrency=3).settings.pool.concurrency == 3
    assert App("sqlite:///other.db").settings.database_url == "sqlite:///other.db"
    with pytest.raises(InvalidArgument, match="App takes a store URL or a Settings, got a int"):
        App(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="'concurency' is not a setting"):
        App(backend.url, concurency=3)
    with pytest.raises(InvalidArgument, match="registry must be a WorkflowRegistry, got"):
        App(backend.url, registry="mod:registry")  # type: ignore[arg-type]


def test_a_workflow_is_declared_once_and_its_definition_checked_where_declared(
    backend: Backend,
) -> None:
    with App(backend.url) as app:
        app.workflow("once")
        with pytest.raises(InvalidArgument, match=r"Workflow\('once', version=1\) is already declared"):
            app.workflow("once")
        with pytest.raises(InvalidArgument, match="WorkflowDefinition.budget must be a Budget"):
            app.workflow("costly", budget=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="has no @main function"):
            app.start("once", None)
    with App(backend.url) as granted:
        fetch = granted.workflow("fetch", capabilities=["network"], budget=Budget(max_steps=5))

        @fetch.step(capabilities=["network"])
        def get(ctx: Any) -> int:
            return 1

        @fetch.main
        def main(ctx: Any, _: None) -> int:
            return get(ctx)

        assert granted.start("fetch", None).task_id
        definition = granted.registry.get("fetch", 1)
        assert definition is not None and definition.budget == Budget(max_steps=5)


def test_an_app_with_no_workflows_refuses_to_run_workers_saying_so(backend: Backend) -> None:
    with App(backend.url) as empty, pytest.raises(InvalidArgument, match="has no workflows to run"):
        empty.run_once()
    with App(backend.url, registry=WorkflowRegistry()) as given, pytest.raises(InvalidArgument):
        given.worker()


def test_a_forked_child_opens_its_own_store_and_leaves_the_parents_alone(app: App) -> None:
    parents = app.store
    pid = os.fork()
    if pid == 0:  # the child: any failure is its exit status
        code = 1
        try:
            child_store = app.store
            if child_store is not parents:
                app.start("order", {"order_id": "child", "quantity": 1}, task_id="from-child")
                app.close()
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert app.store is parents
    assert parents.get_task("from-child").state is TaskState.QUEUED


def test_a_start_in_the_applications_own_transaction_exists_only_if_it_commits(
    app: App, backend: Backend
) -> None:
    from tests.store.test_enqueue_in_transaction import app_connection

    app.store  # noqa: B018 - migrated before the application's connection writes
    with app_connection(backend) as conn:
        rolled_back = app.start("order", {"order_id": "o1", "quantity": 1}, task_id="o1", connection=conn)
        conn.rollback()
        committed = app.start("order", {"order_id": "o2", "quantity": 1}, task_id="o2", connection=conn)
        conn.commit()
    with pytest.raises(TaskNotFound):
        rolled_back.status()
    assert committed.status().state is TaskState.QUEUED
