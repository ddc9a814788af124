"""The shared SQL store: every :class:`WorkflowStore` operation, written once over a
:class:`~runifold_sync.store.dialect.Dialect`.

The operations live in three parts: producers and operators (:mod:`.sql_operators`),
the worker's claim and fenced writes (:mod:`.sql_transitions`), and here the reads,
tenant policies, the worker registry, store time and the lifecycle. The SQLite and
PostgreSQL stores are this class with their dialect and their way of being opened.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from ..admission import TenantAdmission, TenantPolicy
from ..models import TaskState, WorkerId
from . import checks, row_records
from .base import WorkflowStore
from .dialect import Dialect
from .records import QueueStats, TaskEvent, TaskRecord, VersionReference, WorkerRecord
from .sql_operators import OperatorOperations
from .sql_transitions import WorkerOperations


class SqlStore(OperatorOperations, WorkerOperations, WorkflowStore):
    """A store on ``dialect``. ``max_pending_signals`` caps the signals a task keeps
    unconsumed; more are refused."""

    def __init__(self, dialect: Dialect, *, max_pending_signals: int = checks.MAX_PENDING_SIGNALS) -> None:
        self.dialect = dialect
        self.max_pending_signals = checks.check_pending_cap(max_pending_signals)

    # --- reads -----------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRecord:
        return self.explain_reasons(
            [self._record(self.dialect.one("select_task", {"task_id": task_id}), task_id)]
        )[0]

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        tenant: str | None = None,
        definition: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        found = self.dialect.all("list_tasks", checks.list_filters(state, tenant, definition, limit))
        return self.explain_reasons([self._record(row, row["task_id"]) for row in found])

    def referenced_versions(self) -> list[VersionReference]:
        return [row_records.version_reference(row) for row in self.dialect.all("referenced_versions", {})]

    def queue_stats(self) -> list[QueueStats]:
        return [row_records.queue_stats(row) for row in self.dialect.all("queue_stats", {})]

    def history(self, task_id: str) -> list[TaskEvent]:
        found = self.dialect.all("task_events", {"task_id": task_id})
        return [row_records.task_event(row, self.dialect) for row in found]

    # --- tenant admission ------------------------------------------------------------

    def set_tenant_policy(self, policy: TenantPolicy) -> None:
        checks.check_policy(policy)
        budget = policy.budget
        params = {
            "tenant": policy.tenant,
            "max_leased": policy.max_leased,
            "budget_cost": None if budget is None else budget.cost,
            "budget_window": None if budget is None else self.dialect.db_duration(budget.window),
        }
        self.dialect.execute("set_tenant_policy", params)

    def tenant_admission(self) -> list[TenantAdmission]:
        return [
            row_records.tenant_admission(row, self.dialect)
            for row in self.dialect.all("tenant_admission", {})
        ]

    # --- worker registry -------------------------------------------------------------

    def register_worker(
        self, worker_id: WorkerId, *, host: str, pid: int, definitions: list[tuple[str, int]]
    ) -> None:
        params = {
            "worker_id": worker_id.value,
            "host": host,
            "pid": pid,
            "definitions": json.dumps(definitions),
        }
        self.dialect.execute("register_worker", params)

    def worker_seen(self, worker_id: WorkerId, pid: int) -> None:
        self.dialect.execute("worker_seen", {"worker_id": worker_id.value, "pid": pid})

    def worker_stopped(self, worker_id: WorkerId, pid: int) -> None:
        self.dialect.execute("worker_stopped", {"worker_id": worker_id.value, "pid": pid})

    def workers(self) -> list[WorkerRecord]:
        return [row_records.worker_record(row, self.dialect) for row in self.dialect.all("list_workers", {})]

    # --- time and lifecycle ----------------------------------------------------------

    def now(self) -> datetime:
        row = self.dialect.one("now", {})
        assert row is not None
        return self.dialect.time(row["now"])

    def set_clock_offset(self, offset: timedelta) -> None:
        offset = checks.check_clock_offset(offset)
        self.dialect.execute("set_clock_offset", {"offset": self.dialect.db_duration(offset)})

    def migrate(self) -> int:
        """Apply pending numbered migrations; returns the schema version."""
        return self.dialect.migrate()

    def close(self) -> None:
        """Idempotent. In a forked child it only marks the store closed: the parent's
        connections must not be touched from there."""
        self.dialect.close()
