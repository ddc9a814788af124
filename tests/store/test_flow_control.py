"""Flow control by key in the store contract, on every backend: which limit applies to a
task, what a held task's reason says, dedup windows, singletons and debounce."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import App, LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.codec import to_json
from runifold_sync.model.flow import FlowLimit, Rate
from runifold_sync.store import TaskState
from runifold_sync.store.records import ClaimRequest, Completion
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.old_schema import schema_at

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")


def task(task_id: str, **options: Any) -> WorkflowTask:
    return WorkflowTask.new(
        options.pop("name", "orders"), 1, {"id": task_id}, checkpoint_id=task_id, **options
    )


def claimed(store: WorkflowStore, limit: int = 10) -> list[str]:
    return sorted(c.lease.task_id for c in store.claim(W1, LEASE, limit=limit))


# --- concurrency limits ----------------------------------------------------------------


def test_a_key_at_max_running_is_skipped_and_its_next_task_runs_when_a_lease_ends(
    store: WorkflowStore,
) -> None:
    store.set_flow_limit(FlowLimit("key", "customer-1", max_running=1))
    store.enqueue_many([task(f"c1-{n}", concurrency_key="customer-1") for n in range(3)])
    store.enqueue(task("c2-0", concurrency_key="customer-2"))
    first = store.claim(W1, LEASE, limit=10)
    assert sorted(c.lease.task_id for c in first) == ["c1-0", "c2-0"]
    assert claimed(store) == []
    done = next(c for c in first if c.lease.task_id == "c1-0")
    store.complete(done.lease, done.revision, to_json({}), to_json(None))
    assert claimed(store) == ["c1-1"]


def test_a_limit_set_elsewhere_binds_the_next_claim_after_claims_made_without_limits(
    backend: Backend,
) -> None:
    """A store claims without the flow-control parts while no limit is set. Another
    process (an operator's CLI) sets one: the first claim after it holds it, whether it
    is a claim alone or the claim of a completion, and nothing it would have leased past
    the limit stays leased."""
    claimer, operator = backend.open(), backend.open()
    claimer.enqueue_many([task(f"k{n}", concurrency_key="k") for n in range(6)])
    [first] = claimer.claim(W1, LEASE)  # no limit set: k0, without flow control
    operator.set_flow_limit(FlowLimit("key", "k", max_running=2))
    assert [c.lease.task_id for c in claimer.claim(W1, LEASE, limit=5)] == ["k1"]
    assert claimer.claim(W1, LEASE, limit=5) == []
    operator.remove_flow_limit("key", "k")
    [after] = claimer.claim(W1, LEASE)  # the limit gone: without flow control again
    operator.set_flow_limit(FlowLimit("key", "k", max_running=3))
    done = Completion(first.lease, first.revision, to_json({}), to_json(None))
    batch = claimer.complete_batch([done], then_claim=ClaimRequest(W1, LEASE, 5))
    assert not batch.refused and [c.lease.task_id for c in batch.claimed] == ["k3"]
    leased = [t for t in claimer.list_tasks() if t.state is TaskState.LEASED]
    assert sorted(t.task_id for t in leased) == ["k1", "k2", "k3"] and after.lease.task_id == "k2"


def test_an_exact_key_limit_wins_over_a_prefix_pattern_and_the_longest_prefix_over_a_shorter(
    store: WorkflowStore,
) -> None:
    store.set_flow_limit(FlowLimit("key", "export:*", max_running=1))
    store.set_flow_limit(FlowLimit("key", "export:big*", max_running=3))
    store.set_flow_limit(FlowLimit("key", "export:vip", max_running=2))
    for key in ("export:a", "export:big-1", "export:vip"):
        store.enqueue_many([task(f"{key}-{n}", concurrency_key=key) for n in range(4)])
    taken = claimed(store, limit=20)
    assert sum(1 for t in taken if t.startswith("export:a-")) == 1
    assert sum(1 for t in taken if t.startswith("export:big-1-")) == 3
    assert sum(1 for t in taken if t.startswith("export:vip-")) == 2


def test_definition_and_queue_limits_cap_all_their_tasks_together(store: WorkflowStore) -> None:
    store.set_flow_limit(FlowLimit("definition", "reports", max_running=2))
    store.set_flow_limit(FlowLimit("queue", "slow", max_running=1))
    store.enqueue_many([task(f"r{n}", name="reports") for n in range(4)])
    store.enqueue_many([task(f"s{n}", queue="slow") for n in range(3)])
    store.enqueue(task("free"))
    taken = claimed(store, limit=20)
    assert sum(1 for t in taken if t.startswith("r")) == 2
    assert sum(1 for t in taken if t.startswith("s")) == 1
    assert "free" in taken


def test_max_running_zero_holds_a_group_and_removing_the_limit_frees_it(store: WorkflowStore) -> None:
    store.set_flow_limit(FlowLimit("key", "k", max_running=0))
    store.enqueue(task("t1", concurrency_key="k"))
    assert claimed(store) == []
    assert store.flow_limits() == [FlowLimit("key", "k", max_running=0)]
    assert store.remove_flow_limit("key", "k") is True
    assert store.remove_flow_limit("key", "k") is False
    assert claimed(store) == ["t1"]


def test_a_held_tasks_reason_names_the_limit_and_stats_show_the_group(store: WorkflowStore) -> None:
    store.set_flow_limit(FlowLimit("key", "acct-*", max_running=1))
    store.enqueue_many([task(f"a{n}", concurrency_key="acct-7") for n in range(3)])
    assert claimed(store) == ["a0"]
    reason = store.flow_hold("a1")
    assert reason is not None and "concurrency limit of key 'acct-7'" in reason and "max_running 1" in reason
    note = store.get_task("a1").status_note  # what show, list and the dashboard print
    assert note is not None and "concurrency limit of key 'acct-7'" in note
    (group,) = store.flow_groups()
    assert (group.name, group.running, group.waiting, group.limit.max_running) == ("acct-7", 1, 2, 1)
    assert store.flow_hold("a0") is None or "running" in store.flow_hold("a0")  # it holds a lease itself


def test_a_rate_limited_task_says_when_it_may_run(store: WorkflowStore) -> None:
    clock = Clock(store)
    store.set_flow_limit(FlowLimit("queue", "default", rate=Rate(2, timedelta(minutes=1))))
    store.enqueue_many([task(f"t{n}") for n in range(3)])
    first = store.claim(W1, LEASE, limit=10)
    assert sorted(c.lease.task_id for c in first) == ["t0", "t1"]
    for done in first:  # ending the leases frees no rate: claims count, not leases
        store.complete(done.lease, done.revision, to_json({}), to_json(None))
    assert claimed(store) == []
    reason = store.flow_hold("t2")
    assert reason is not None and "rate limit of queue 'default'" in reason and "may run at" in reason
    assert store.get_task("t2").status_note == reason
    clock.advance(timedelta(seconds=61))
    assert claimed(store) == ["t2"]


def test_a_rates_claims_are_counted_across_prunes_and_at_most_64_outlive_their_window(
    backend: Backend,
) -> None:
    """A group's claims past its window are dropped at its every 64th claim; the window
    is counted right before and after each drop."""
    store = backend.open()
    clock = Clock(store)
    store.set_flow_limit(FlowLimit("queue", "default", rate=Rate(70, timedelta(seconds=10))))
    store.enqueue_many([task(f"t{n:03}") for n in range(200)])
    assert len(store.claim(W1, LEASE, limit=63)) == 63  # numbered 1..63
    clock.advance(timedelta(seconds=11))  # all 63 out of the window, none dropped yet
    assert backend.query("SELECT COUNT(*) FROM runifold_flow_claims") == [(63,)]
    assert len(store.claim(W1, LEASE, limit=1)) == 1  # the 64th drops them
    assert backend.query("SELECT COUNT(*) FROM runifold_flow_claims") == [(1,)]
    assert len(store.claim(W1, LEASE, limit=100)) == 69  # the window's room: 70 less 1
    assert claimed(store) == []
    assert backend.query("SELECT MIN(seq), MAX(seq) FROM runifold_flow_claims") == [(64, 133)]
    clock.advance(timedelta(seconds=11))
    assert len(store.claim(W1, LEASE, limit=100)) == 67  # the rest: 200 - 133


def test_flow_limits_refuse_bad_values_naming_them() -> None:
    with pytest.raises(
        InvalidArgument, match="^FlowLimit.scope must be one of key, definition, queue, got 'tenant'$"
    ):
        FlowLimit("tenant", "x", max_running=1)
    with pytest.raises(InvalidArgument, match="max_running or rate"):
        FlowLimit("key", "x")
    with pytest.raises(
        InvalidArgument, match=r"^FlowLimit.max_running must be an integer in 0\.\.2147483647, got -1$"
    ):
        FlowLimit("key", "x", max_running=-1)
    with pytest.raises(InvalidArgument, match=r"^Rate.period must be positive, got datetime.timedelta\(0\)$"):
        Rate(1, timedelta(0))
    with pytest.raises(InvalidArgument, match="^FlowLimit.rate must be a Rate, got 5$"):
        FlowLimit("key", "x", rate=5)  # type: ignore[arg-type]


# --- dedup windows and singletons ------------------------------------------------------


def test_a_dedup_key_within_its_window_returns_the_first_task_and_after_it_a_new_one(
    store: WorkflowStore,
) -> None:
    clock = Clock(store)
    window = timedelta(minutes=5)
    first = store.enqueue(task("d1", dedup_key="invoice-9", dedup_window=window))
    again = store.enqueue(task("d2", dedup_key="invoice-9", dedup_window=window))
    assert (first.task_id, first.created, again.task_id, again.created) == ("d1", True, "d1", False)
    clock.advance(window + timedelta(seconds=1))
    later = store.enqueue(task("d3", dedup_key="invoice-9", dedup_window=window))
    assert (later.task_id, later.created) == ("d3", True)


def test_a_singleton_returns_its_unfinished_task_and_replace_cancels_it(store: WorkflowStore) -> None:
    assert store.enqueue(task("s1", dedup_key="sync", singleton=True)).created
    assert store.enqueue(task("s2", dedup_key="sync", singleton=True)).task_id == "s1"
    replaced = store.enqueue(task("s3", dedup_key="sync", singleton=True, replace=True))
    assert (replaced.task_id, replaced.created) == ("s3", True)
    assert store.get_task("s1").state is TaskState.CANCELLED
    assert "replaced by task 's3'" in (store.get_task("s1").reason or "")
    (lease,) = store.claim(W1, LEASE)
    store.complete(lease.lease, lease.revision, to_json({}), to_json(None))
    assert store.enqueue(task("s4", dedup_key="sync", singleton=True)).created  # s3 finished


def test_a_running_singleton_replaced_is_asked_to_cancel(store: WorkflowStore) -> None:
    store.enqueue(task("s1", dedup_key="sync", singleton=True))
    (running,) = store.claim(W1, LEASE)
    store.enqueue(task("s2", dedup_key="sync", singleton=True, replace=True))
    assert store.get_task("s1").state is TaskState.LEASED
    assert [e.kind for e in store.history("s1")][-1] == "cancel_requested"
    # A third enqueue finds the replacement, not the task being cancelled.
    assert store.enqueue(task("s3", dedup_key="sync", singleton=True)).task_id == "s2"
    assert running.lease.task_id == "s1"


def test_flow_options_refuse_bad_combinations_naming_them() -> None:
    with pytest.raises(InvalidArgument, match="dedup_key"):
        task("x", singleton=True)
    with pytest.raises(InvalidArgument, match="replace"):
        task("x", dedup_key="k", replace=True)
    with pytest.raises(InvalidArgument, match="debounce_key"):
        task("x", debounce=timedelta(seconds=1))
    with pytest.raises(InvalidArgument, match="debounce_max"):
        task("x", debounce=timedelta(seconds=2), debounce_key="k", debounce_max=timedelta(seconds=1))
    with pytest.raises(
        InvalidArgument, match="^concurrency_key must be non-empty without surrounding spaces"
    ):
        task("x", concurrency_key=" padded ")
    with pytest.raises(InvalidArgument, match=r"^debounce must be positive, got datetime.timedelta\(0\)$"):
        task("x", debounce=timedelta(0), debounce_key="k")
    with pytest.raises(InvalidArgument, match="^singleton must be True or False, got 1$"):
        task("x", dedup_key="k", singleton=1)  # type: ignore[arg-type]


# --- debounce --------------------------------------------------------------------------


def test_debounced_enqueues_collapse_into_one_task_with_the_latest_input(store: WorkflowStore) -> None:
    clock = Clock(store)
    window = timedelta(seconds=10)
    ids = [
        store.enqueue(
            WorkflowTask.new(
                "orders", 1, {"v": n}, checkpoint_id=f"b{n}", debounce=window, debounce_key="doc-1"
            )
        ).task_id
        for n in range(3)
    ]
    assert ids == ["b0", "b0", "b0"]
    assert claimed(store) == []  # not due until the window passes
    clock.advance(window)
    (run,) = store.claim(W1, LEASE)
    assert (run.lease.task_id, run.input_json) == ("b0", to_json({"v": 2}))
    # Once it is claimed, the next enqueue starts a new task: its input is not lost.
    after = store.enqueue(
        WorkflowTask.new("orders", 1, {"v": 3}, checkpoint_id="b3", debounce=window, debounce_key="doc-1")
    )
    assert (after.task_id, after.created) == ("b3", True)


def test_debounce_max_caps_how_long_enqueues_keep_pushing_the_task_back(store: WorkflowStore) -> None:
    clock = Clock(store)
    options: dict[str, Any] = {
        "debounce": timedelta(seconds=100),
        "debounce_key": "doc",
        "debounce_max": timedelta(seconds=250),
    }
    for n in range(4):  # at 0, 80, 160 and 240 s: each pushes the run 100 s on, capped at 250 s
        store.enqueue(WorkflowTask.new("orders", 1, n, checkpoint_id=f"m{n}", **options))
        if n < 3:
            clock.advance(timedelta(seconds=80))
    assert claimed(store) == []
    clock.advance(timedelta(seconds=10))  # 250 s: the cap, though the last enqueue said 340 s
    (run,) = store.claim(W1, LEASE)
    assert (run.lease.task_id, run.input_json) == ("m0", "3")


# --- through the App -------------------------------------------------------------------


@attrs.frozen
class Export:
    customer: str
    rows: int


def test_a_definition_computes_the_concurrency_key_and_start_takes_the_flow_options(backend: Backend) -> None:
    with App(backend.url) as app:
        exports = app.workflow("export", concurrency_key=lambda export: f"customer:{export.customer}")

        @exports.main
        def run(ctx: Any, export: Export) -> int:
            return export.rows

        app.store.set_flow_limit(FlowLimit("key", "customer:*", max_running=1))
        first = app.start("export", {"customer": "acme", "rows": 1})
        assert app.store.get_task(first.task_id).concurrency_key == "customer:acme"
        given = app.start("export", {"customer": "acme", "rows": 2}, concurrency_key="manual")
        assert app.store.get_task(given.task_id).concurrency_key == "manual"
        once = app.start(
            "export", {"customer": "x", "rows": 3}, dedup_key="x", dedup_window=timedelta(hours=1)
        )
        again = app.start(
            "export", {"customer": "x", "rows": 4}, dedup_key="x", dedup_window=timedelta(hours=1)
        )
        assert once.task_id == again.task_id
        with pytest.raises(InvalidArgument, match="concurrency key that 'export' computed"):
            app.start("export", {"customer": " spaced ", "rows": 1})
        with pytest.raises(
            InvalidArgument,
            match="^WorkflowDefinition.concurrency_key must be a function of the input, got 'k'$",
        ):
            app.workflow("keyed", concurrency_key="k")  # type: ignore[arg-type]


# --- priority aging --------------------------------------------------------------------


def _starved_for(store: WorkflowStore, *, aging: bool) -> int | None:
    """Store-time steps of 10 s, each bringing one priority-5 task and running one claim:
    the step at which the priority-0 task queued first is claimed (None: not in 20)."""
    clock = Clock(store)
    store.enqueue(task("low", priority=0))
    for step in range(20):
        store.enqueue(task(f"high-{step}", priority=5))
        if aging:
            store.age_priorities(timedelta(seconds=10), up_to=5)
        (claimed,) = store.claim(W1, LEASE)
        store.complete(claimed.lease, claimed.revision, to_json({}), to_json(None))
        if claimed.lease.task_id == "low":
            return step
        clock.advance(timedelta(seconds=10))
    return None


def test_without_aging_a_stream_of_higher_priority_work_starves_a_low_priority_task(
    store: WorkflowStore,
) -> None:
    assert _starved_for(store, aging=False) is None


def test_aging_raises_a_waiting_task_one_level_per_period_until_it_runs(store: WorkflowStore) -> None:
    # 5 levels at one per 10 s: priority 5 after 50 s, then the oldest of its priority.
    assert _starved_for(store, aging=True) == 5
    assert store.get_task("low").priority == 5
    assert store.age_priorities(timedelta(seconds=10), up_to=5) == 0  # nothing left below 5


def test_migration_numbers_the_claims_a_rate_counts_in_their_order(backend: Backend) -> None:
    """Claims recorded before version 25 are numbered per group in the order they were
    made (whatever order their rows are in), so a window counted by numbers counts them."""
    ph = "?" if backend.kind == "sqlite" else "%s"
    with schema_at(backend, 23) as execute:
        for name, at in [("a", 3), ("b", 1), ("a", 1), ("a", 2)]:
            stamp = at * 1_000_000 if backend.kind == "sqlite" else datetime.fromtimestamp(at, UTC)
            insert = f"INSERT INTO runifold_flow_claims (scope, name, at) VALUES ('key', {ph}, {ph})"
            execute(insert, (name, stamp))
    backend.open()
    rows = backend.query("SELECT name, seq FROM runifold_flow_claims ORDER BY name, at")
    assert rows == [("a", 1), ("a", 2), ("a", 3), ("b", 1)]
