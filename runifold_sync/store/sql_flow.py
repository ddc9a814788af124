"""Flow control by key, written once over a :class:`Dialect`: the limits (concurrency and
rate per key, definition or queue) that the claim statements apply, and what an enqueue
does with a dedup key, a singleton or a debounce.

Where each rule is enforced, so that it holds across every worker process and host:

- **Limits**, in the claim (``claimable_flow``/``claim_flow`` and the ranking in
  ``claimable_in_turns``/``claim_lease_chosen``): a group at its limit is left out of
  the scan of ready tasks (its backlog never holds back another key's tasks), and each
  group's candidates past its room are dropped. SQLite's ``BEGIN IMMEDIATE`` makes the
  counts exact; on PostgreSQL the claim's first statement locks the limit rows
  (``lock_limited_tenants``), as it locks limited tenants, so claimers take turns while
  any limit exists and each counts the leases of the ones before it. A rate counts
  claims in ``runifold_flow_claims``, stamped in store time.
- **Dedup, singleton, debounce**, in the enqueue's transaction, after a lock on the key
  (``lock_flow_key``: an advisory transaction lock on PostgreSQL, the database lock on
  SQLite), so two enqueues of one key take turns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from ..errors import InvalidArgument
from ..model import crashpoints, validate
from ..model.flow import FlowGroup, FlowLimit, Rate, limit_scope
from ..model.values import WorkflowTask
from .dialect import Dialect, Event, Row, Transaction
from .records import EnqueueResult, TaskRecord

# Cancels a task inside a transaction (``OperatorOperations._cancel_in``): how a
# singleton's ``replace=True`` ends the task it replaces.
Cancel = Callable[[Transaction, str, str, str], object]

# The groups a claimed candidate counts in, by the columns the claims return.
_RATED = (
    ("key", "concurrency_key", "key_rated"),
    ("definition", "definition_name", "definition_rated"),
    ("queue", "queue", "queue_rated"),
)


class FlowOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect

    def set_flow_limit(self, limit: FlowLimit) -> None:
        """Store ``limit`` for its scope and target, replacing any earlier one; every
        worker's next claim applies it."""
        validate.instance("limit", limit, FlowLimit)
        rate = limit.rate
        params = {
            "scope": limit.scope,
            "target": limit.target,
            "max_running": limit.max_running,
            "rate_count": None if rate is None else rate.count,
            "rate_period": None if rate is None else self.dialect.db_duration(rate.period),
        }
        self.dialect.execute("set_flow_limit", params)

    def remove_flow_limit(self, scope: str, target: str) -> bool:
        """Remove the limit on ``scope`` ``target``; False when there was none."""
        params = {"scope": limit_scope("scope", scope), "target": validate.name("target", target)}
        with self.dialect.transaction() as tx:
            return tx.one("remove_flow_limit", params) is not None

    def flow_limits(self) -> list[FlowLimit]:
        """Every flow limit, by scope and target."""
        return [flow_limit(row, self.dialect) for row in self.dialect.all("flow_limits", {})]

    def flow_groups(self) -> list[FlowGroup]:
        """Every limited group with tasks running, ready or claimed in its window, and
        where it stands now (running, the limit, waiting): what ``stats``, the dashboard
        and the metrics show per key."""
        return read_flow_groups(self.dialect)

    def flow_hold(self, task_id: str) -> str | None:
        """Why ready task ``task_id`` is not being claimed by its flow limits (the limit
        that holds it, and for a rate when it may run), or None when none holds it."""
        record = self.get_task(task_id)  # type: ignore[attr-defined]
        return hold_of(record, read_flow_groups(self.dialect, record))

    def age_priorities(self, waited: timedelta, *, up_to: int) -> int:
        """Priority aging: every ready task gains one priority level for each ``waited``
        it has been ready (counted from its priority at enqueue), up to ``up_to``; none is
        lowered. Run it periodically (a schedule, cron: ``flow age``) so a steady stream
        of higher priority work delays lower priority work by at most about
        ``waited`` times the difference, instead of for ever. Returns how many tasks rose."""
        d = self.dialect
        params = {
            "waited": d.db_duration(validate.positive_duration("waited", waited)),
            "up_to": validate.stored_int("up_to", up_to),
        }
        with d.transaction() as tx:
            return len(tx.all("age_priorities", params))


def read_flow_groups(d: Dialect, task: TaskRecord | None = None) -> list[FlowGroup]:
    """Every limited group (``flow_group_stats``), or with ``task`` only its own groups,
    without their waiting counts (a read of the leases, not of the backlog)."""
    groups = []
    if task is None:
        rows = d.all("flow_group_stats", {})
    else:
        params = {
            "concurrency_key": task.concurrency_key,
            "definition_name": task.definition_name,
            "queue": task.queue,
        }
        rows = d.all("flow_groups_of_task", params)
    for row in rows:
        oldest = row["oldest_claim_at"]
        groups.append(
            FlowGroup(
                flow_limit(row, d),
                row["name"],
                d.time(row["at"]),
                int(row["running"]),
                int(row["claimed_in_window"]),
                int(row["waiting"]),
                None if oldest is None else d.time(oldest),
            )
        )
    return groups


def hold_of(record: TaskRecord, groups: list[FlowGroup]) -> str | None:
    """The reason the first of ``groups`` that holds ``record``'s task gives, if any."""
    for group in groups:
        scope, name = group.limit.scope, group.name
        member = (
            (scope == "key" and record.concurrency_key == name)
            or (scope == "definition" and record.definition_name == name)
            or (scope == "queue" and record.queue == name)
        )
        reason = group.hold_reason() if member else None
        if reason is not None:
            return reason
    return None


def flow_limit(row: Row, d: Dialect) -> FlowLimit:
    rate = None
    if row["rate_count"] is not None:
        rate = Rate(int(row["rate_count"]), d.duration(row["rate_period"]))
    return FlowLimit(row["scope"], row["target"], row["max_running"], rate)


def rated_claims(candidate: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (scope, name) groups whose rate a claim of ``candidate`` (a row of the claim
    query) counts in."""
    return [(scope, candidate[column]) for scope, column, rated in _RATED if candidate[rated]]


def flow_params(d: Dialect, task: WorkflowTask) -> dict[str, Any]:
    """The flow columns of ``task``'s row (insert_task's parameters)."""
    flow = task.flow
    debounce = None if flow is None else flow.debounce
    debounce_max = None if flow is None else flow.debounce_max
    return {
        "concurrency_key": task.concurrency_key,
        "dedup_key": None if flow is None else flow.dedup_key,
        "debounce_key": None if flow is None else flow.debounce_key,
        "debounce": None if debounce is None else d.db_duration(debounce),
        "debounce_max": None if debounce_max is None else d.db_duration(debounce_max),
    }


def collapsed(
    d: Dialect, tx: Transaction, task: WorkflowTask, params: dict[str, Any], cancel: Cancel | None
) -> EnqueueResult | None:
    """What an enqueue of ``task`` (with a dedup key, a singleton or a debounce) returns
    instead of inserting it, inside ``tx`` after the key's lock; None when it inserts.
    A singleton's ``replace`` cancels the task it replaces (``cancel``) and inserts."""
    flow = task.flow
    if flow is None:
        return None
    if flow.debounce is not None:
        assert flow.debounce_key is not None
        tx.one("lock_flow_key", {"key": "debounce:" + flow.debounce_key})
        folded = tx.one("debounce_fold", params)
        if crashpoints.ARMED:
            crashpoints.reached("flow_enqueue", flow.debounce_key)
        if folded is None:
            return None
        detail = {
            "debounce_key": flow.debounce_key,
            "task_id": task.task_id,
            "due_at": str(d.time(folded["ready_at"])),
        }
        d.event(tx, Event(folded["task_id"], folded["at"], "debounced", detail))
        return EnqueueResult(folded["task_id"], created=False)
    if flow.dedup_key is None:
        return None
    tx.one("lock_flow_key", {"key": "dedup:" + flow.dedup_key})
    key = {"dedup_key": flow.dedup_key}
    if flow.dedup_window is not None:
        found = tx.one("dedup_within", key | {"window": d.db_duration(flow.dedup_window)})
        return None if found is None else EnqueueResult(found["task_id"], created=False)
    found = tx.one("singleton_unfinished", key)
    if found is None:
        return None
    if not flow.replace:
        return EnqueueResult(found["task_id"], created=False)
    if cancel is None:
        raise InvalidArgument(
            "replace=True cannot be used here: this enqueue cannot cancel the task it replaces"
        )
    note = f"replaced by task {task.task_id!r} of singleton key {flow.dedup_key!r}"
    cancel(tx, found["task_id"], "flow", note)
    if crashpoints.ARMED:
        crashpoints.reached("flow_enqueue", flow.dedup_key)
    return None
