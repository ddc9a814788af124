"""The SQLite routed claim and idle wait read only the index slices of the worker's
routes (and the expired leases, by expiry): no scan of runifold_tasks, no sort of a
route's backlog (EXPLAIN QUERY PLAN), over a backlog the worker does not serve."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.records import Routes
from runifold_sync.store.sqlite.store import _Q, _routes_json

ROUTES = Routes.serving(["default"], [("orders", 1, "fp-a"), ("refunds", 2, "fp-r")])


def plan(store: SqliteWorkflowStore, name: str, params: dict[str, object]) -> list[str]:
    conn = store.dialect._conn().raw
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + _Q[name], params)]


def test_the_routed_claim_and_wait_search_their_route_indexes_only(sqlite_store: SqliteWorkflowStore) -> None:
    unserved = [
        WorkflowTask.new("billing", 1, None, queue="default" if n % 2 else "render", checkpoint_id=f"u{n}")
        for n in range(2000)
    ]
    sqlite_store.enqueue_many(unserved)
    sqlite_store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="mine"))
    routes = _routes_json(ROUTES)
    claim = plan(sqlite_store, "claimable_routed_tasks", {"now": 0, "limit": 3, "routes": routes})
    assert not [line for line in claim if line.startswith("SCAN") and "runifold_tasks" in line], claim
    assert any(
        "SEARCH x USING INDEX runifold_tasks_routed (tenant=? AND queue=? AND definition_name=? "
        "AND definition_version=?)" in line
        for line in claim
    ), claim
    assert not any(line in ("SCAN x", "SCAN t") for line in claim), claim
    # The one sort inside the route's subquery would be of its whole backlog: none.
    lists = [n for n, line in enumerate(claim) if line.startswith("CORRELATED LIST")]
    assert len(lists) == 2, claim
    subquery = claim[lists[0] + 1]
    assert subquery.startswith("SEARCH x USING INDEX runifold_tasks_routed"), claim
    # The expired leases of each route (taken first within a priority) are read by their
    # expiry from the partial index of leased tasks, never from the route's backlog.
    assert claim[lists[1] + 1] == "SEARCH x USING INDEX runifold_tasks_leased (tenant=? AND lease_expires<?)"
    wait = plan(sqlite_store, "seconds_until_routed_due", {"routes": routes})
    assert any("SEARCH t USING INDEX runifold_tasks_routed_due" in line for line in wait), wait
    assert not [line for line in wait if line.startswith("SCAN") and "clock" not in line], wait
    worker, lease = WorkerId.parse("w"), LeaseDuration(timedelta(seconds=30))
    assert [c.lease.task_id for c in sqlite_store.claim(worker, lease, limit=5, routes=ROUTES)] == ["mine"]
    assert not sqlite_store.wait_for_work(timedelta(0), ROUTES)
