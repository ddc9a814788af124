"""The ``WorkflowStore`` contract, and the one place each operation is written.

The store owns time and every state transition. Each write that a worker makes under a
lease names the lease's fencing token; the store applies it only while that token still
holds an unexpired lease, and raises :class:`LeaseLostError` otherwise. Checkpoint
writes also name the revision they extend, so two writers can never interleave progress.

Every operation is written once, over a :class:`~runifold_sync.store.dialect.Dialect`
(what a database must provide: named queries in transactions, store time, value
adapters, the fenced transitions and the claim), and documented where it is written:

- producers and operators (enqueue, signals, cancel, requeue, effect resolution, the
  dashboard's logins): :mod:`.sql_operators`;
- the worker's claim and fenced writes: :mod:`.sql_transitions`;
- reads, tenant admission, the worker registry, store time and the lifecycle:
  :mod:`.sql_reads`;
- waiting for a task to finish and reading the events it publishes:
  :mod:`.sql_results`;
- schedules (declaring them, a tick's task, pause, resume and removal): :mod:`.sql_schedules`;
- retention, deleting old finished tasks: :mod:`.sql_retention`;
- repairs (fork, resuming a cancelled task, retry and cancel by filter): :mod:`.sql_repairs`.

The backends (:mod:`.sqlite`, :mod:`.postgres`) are a dialect and a way of opening it.
"""

from __future__ import annotations

import abc
import os
import weakref

from ..model import validate
from ..model.values import WorkflowTask
from . import checks
from .dialect import Dialect
from .outage import OutageLog
from .records import EnqueueResult
from .sql_flow import FlowOperations
from .sql_operators import OperatorOperations
from .sql_reads import ReadOperations
from .sql_repairs import RepairOperations
from .sql_results import ResultOperations
from .sql_retention import RetentionOperations
from .sql_schedules import ScheduleOperations
from .sql_transitions import StepConnection, WorkerOperations
from .sql_updates import UpdateOperations
from .timing import OperationTimer

# Every store opened and not yet closed, and the process that opened it: what
# ``open_here`` reports to a pool about to fork.
_open: weakref.WeakKeyDictionary[WorkflowStore, int] = weakref.WeakKeyDictionary()


class WorkflowStore(
    UpdateOperations,
    OperatorOperations,
    WorkerOperations,
    ReadOperations,
    ResultOperations,
    ScheduleOperations,
    RetentionOperations,
    RepairOperations,
    FlowOperations,
    abc.ABC,
):
    """Semantic operations of the control plane on ``dialect``. Thread-safe: the
    worker's heartbeat thread shares the store with the thread running steps.
    ``max_pending_signals`` caps the signals a task keeps unconsumed; more are refused.
    Open one with :func:`~runifold_sync.open_store` or a backend's ``open``/``connect``."""

    def __init__(self, dialect: Dialect, *, max_pending_signals: int = checks.MAX_PENDING_SIGNALS) -> None:
        self.dialect = dialect
        self.max_pending_signals = validate.count("max_pending_signals", max_pending_signals)
        # Hears the duration of each worker operation (``timing``); a worker with an
        # observer sets it.
        self.operation_timer: OperationTimer | None = None
        # Where transaction steps run when not in the store's own transaction
        # (:meth:`run_transaction_steps_on`).
        self.step_connection: StepConnection | None = None
        self.claims_in_doubt: set[str] = set()
        _open[self] = os.getpid()

    @property
    def outage(self) -> OutageLog:
        """Where a worker reports failures that mean the database is unavailable, and its
        recovery: one warning each (see :mod:`.outage`)."""
        return self.dialect.outage

    def enqueue(self, task: WorkflowTask, *, connection: object = None) -> EnqueueResult:
        """Insert ``task``; an identical task with the same id is returned as it is, a
        different one raises :class:`EnqueueConflict`. With ``connection``, in the
        application's open transaction on it (:meth:`enqueue_many`). Idempotent while
        the task is stored: after :meth:`prune` deleted it, its id enqueues a new task."""
        (result,) = self.enqueue_many([task], connection=connection)
        return result

    def close(self) -> None:
        _open.pop(self, None)
        super().close()

    def __enter__(self) -> WorkflowStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_here() -> list[WorkflowStore]:
    """The stores this process opened and has not closed (a forked child's inherited
    ones are not its own, and it never closes them)."""
    pid = os.getpid()
    return [store for store, opened_by in list(_open.items()) if opened_by == pid]
