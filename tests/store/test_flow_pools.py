"""Flow limits under several worker processes, on every contract backend: each limit is
checked against the history (store time), never exceeded, and every task runs once.

The processes are in ``tests/support/flow_workers.py``: claimers that hold their leases a
while (so leases of one key overlap when a limit lets them), and enqueuers racing
debounced or singleton enqueues against the claimers.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import WorkflowTask, open_store
from runifold_sync.model.flow import FlowLimit, Rate
from runifold_sync.store import TaskEvent
from tests.support import spawned
from tests.support.backends import Backend, contract_backend
from tests.support.flow_workers import hold_and_complete, keyed_enqueuer

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend


def run(
    url: str, claimers: int, hold_s: float, patience_s: float, enqueuers: list[tuple[Any, ...]] = ()
) -> list[dict[str, Any]]:
    context = spawned.context()
    go, results = context.Event(), context.Queue()
    processes = [
        context.Process(target=hold_and_complete, args=(url, f"claimer-{n}", hold_s, patience_s, go, results))
        for n in range(claimers)
    ] + [
        context.Process(target=keyed_enqueuer, args=(url, f"enqueuer-{n}", *args, go, results))
        for n, args in enumerate(enqueuers)
    ]
    for process in processes:
        process.start()
    go.set()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert [e for r in reports for e in r["errors"]] == []
    return reports


def completed_once(reports: list[dict[str, Any]], expected: set[str], *, shared: bool = True) -> None:
    done = Counter(task_id for r in reports for task_id in r.get("completed", []))
    assert [t for t, n in done.items() if n > 1] == [], "a task completed twice"
    assert set(done) == expected, f"{len(expected - set(done))} tasks never ran"
    if shared:
        assert sum(1 for r in reports if r.get("completed")) >= 2, "the claimers did not run concurrently"


def moment(event: TaskEvent, kind: str) -> tuple[Any, ...]:
    """Where ``event`` falls among the writes of the run, comparable across tasks. SQLite
    takes one writer at a time, so its event ids follow commit order, whereas its store
    time is each process's boot clock calibrated on its own (processes disagree by a
    fraction of a millisecond, enough to show a claim that committed after a completion
    as overlapping it). PostgreSQL's store time is the server's one clock."""
    return (event.event_id,) if kind == "sqlite" else (event.at,)


def lease_spans(backend: Backend, task_ids: set[str]) -> dict[str, list[tuple[Any, Any]]]:
    """Each task's lease span (claimed to completed, in commit order), by concurrency key."""
    spans: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    with open_store(backend.url) as store:
        for task_id in task_ids:
            key = store.get_task(task_id).concurrency_key
            events = store.history(task_id)
            claimed = [moment(e, backend.kind) for e in events if e.kind == "claimed"]
            ended = [moment(e, backend.kind) for e in events if e.kind == "completed"]
            assert len(claimed) == len(ended) == 1, events  # leases never expired here
            spans[str(key)].append((claimed[0], ended[0]))
    return spans


def most_at_once(spans: list[tuple[Any, Any]]) -> int:
    """The most spans holding at one instant (half-open: an end before a start at a tie)."""
    edges = sorted([(end, 0) for _, end in spans] + [(start, 1) for start, _ in spans])
    held = most = 0
    for _, starts in edges:
        held += 1 if starts else -1
        most = max(most, held)
    return most


@pytest.mark.timeout(180)
def test_concurrency_limits_hold_across_processes_and_a_full_key_blocks_no_other(backend: Backend) -> None:
    url = backend.url
    with open_store(url) as store:
        store.set_flow_limit(FlowLimit("key", "hot", max_running=1))
        store.set_flow_limit(FlowLimit("key", "k*", max_running=2))
        tasks = [
            WorkflowTask.new("orders", 1, n, checkpoint_id=f"hot-{n}", concurrency_key="hot")
            for n in range(40)
        ]
        tasks += [
            WorkflowTask.new("orders", 1, n, checkpoint_id=f"k{k}-{n}", concurrency_key=f"k{k}")
            for k in range(5)
            for n in range(8)
        ]
        # The hot key's backlog first, in claim order; each key's tasks side by side, so
        # a claim batch takes two of one key where the limit lets it.
        store.enqueue_many(tasks)
    reports = run(url, claimers=3, hold_s=0.02, patience_s=1.0)
    ids = {t.task_id for t in tasks}
    completed_once(reports, ids)
    spans = lease_spans(backend, ids)
    assert most_at_once(spans["hot"]) == 1
    for k in range(5):
        assert 1 <= most_at_once(spans[f"k{k}"]) <= 2
    assert max(most_at_once(spans[f"k{k}"]) for k in range(5)) == 2, "the limit of 2 was never reached"
    # No head-of-line blocking: the other keys' tasks, queued behind the hot backlog,
    # all ran before that backlog (one at a time) drained.
    last_other = max(end for k in range(5) for _, end in spans[f"k{k}"])
    assert last_other < max(end for _, end in spans["hot"])


@pytest.mark.timeout(180)
def test_a_rate_limit_holds_in_every_window_across_processes(backend: Backend) -> None:
    url = backend.url
    rate = Rate(6, timedelta(milliseconds=400))
    with open_store(url) as store:
        store.set_flow_limit(FlowLimit("definition", "orders", rate=rate))
        tasks = [WorkflowTask.new("orders", 1, n, checkpoint_id=f"r-{n}") for n in range(30)]
        store.enqueue_many(tasks)
        other = [WorkflowTask.new("refunds", 1, n, checkpoint_id=f"u-{n}") for n in range(10)]
        store.enqueue_many(other)
    reports = run(url, claimers=3, hold_s=0.0, patience_s=1.5)
    completed_once(reports, {t.task_id for t in tasks + other})
    with open_store(url) as store:
        claims = sorted(e.at for t in tasks for e in store.history(t.task_id) if e.kind == "claimed")
    assert len(claims) == 30
    for i, at in enumerate(claims):  # the claims within (at - period, at]
        in_window = sum(1 for other_at in claims[: i + 1] if other_at > at - rate.period)
        assert in_window <= rate.count, f"{in_window} claims in the window ending {at}"
    # Pacing, not a stall: 30 claims at 6 per 0.4 s take at least 1.6 s.
    assert claims[-1] - claims[0] >= rate.period * (30 // rate.count - 1)


@pytest.mark.timeout(180)
def test_debounced_enqueues_racing_claims_lose_no_input(backend: Backend) -> None:
    url = backend.url
    keys = ["a", "b", "c"]
    reports = run(
        url,
        claimers=2,
        hold_s=0.005,
        patience_s=1.0,
        enqueuers=[("debounce", keys, 40, 0.03), ("debounce", keys, 40, 0.03)],
    )
    enqueued = [
        (r["name"], key, seq, task_id) for r in reports for key, seq, task_id in r.get("enqueued", [])
    ]
    assert len(enqueued) == 80
    task_ids = {task_id for *_, task_id in enqueued}
    completed_once(reports, task_ids, shared=False)
    assert len(task_ids) < 80, "no enqueue was collapsed into another's task"
    ran = {task_id: json.loads(text) for r in reports for task_id, text in r.get("inputs", {}).items()}
    for name, key, seq, task_id in enqueued:
        input = ran[task_id]
        assert input["key"] == key
        # An enqueue that went to a task which then ran with an earlier input of the same
        # enqueuer would be an input lost to the race with the claim.
        if input["by"] == name:
            assert input["seq"] >= seq, (name, seq, task_id, input)


@pytest.mark.timeout(180)
def test_singletons_never_overlap_across_processes(backend: Backend) -> None:
    url = backend.url
    keys = ["s1", "s2"]
    reports = run(
        url,
        claimers=2,
        hold_s=0.01,
        patience_s=1.0,
        enqueuers=[("singleton", keys, 30, 0.02), ("singleton", keys, 30, 0.02)],
    )
    enqueued = [(key, task_id) for r in reports for key, _, task_id in r.get("enqueued", [])]
    task_ids = {task_id for _, task_id in enqueued}
    completed_once(reports, task_ids, shared=False)
    assert len(task_ids) < 60, "no enqueue found its key's unfinished task"
    with open_store(url) as store:
        for key in keys:
            spans = []
            for task_id in {t for k, t in enqueued if k == key}:
                events = store.history(task_id)
                start = next(moment(e, backend.kind) for e in events if e.kind == "enqueued")
                spans.append((start, next(moment(e, backend.kind) for e in events if e.kind == "completed")))
            assert most_at_once(spans) == 1, key
