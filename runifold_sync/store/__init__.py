"""Stores: the durable control plane, and the records their methods return.

``base`` is the :class:`WorkflowStore` contract, each operation written once over a
``dialect``; ``sqlite`` and ``postgres`` are the two dialects, opened by
:func:`open_store`. The names below are what an application or an operator's script
reads from a store (``get_task``'s :class:`TaskRecord`, ``workers``'
:class:`WorkerRecord` ...) or hands to it (:class:`TenantPolicy`).
"""

from ..model.admission import TenantAdmission, TenantBudget, TenantPolicy
from ..model.checkpoint import JournalEntry
from ..model.values import DeclaredSignals, DefinitionIdentity, TaskOutcome, TaskState
from .base import WorkflowStore
from .open import open_store
from .records import (
    ClockReading,
    EnqueueResult,
    Lease,
    PublishedEvent,
    QueueStats,
    Signal,
    SignalCheck,
    SignalDelivery,
    TaskEvent,
    TaskPage,
    TaskRecord,
    VersionReference,
    WorkerRecord,
)
from .schedule_records import ScheduleEvent, ScheduleRecord, TickAttempt

__all__ = [
    "ClockReading",
    "DeclaredSignals",
    "DefinitionIdentity",
    "EnqueueResult",
    "JournalEntry",
    "Lease",
    "PublishedEvent",
    "QueueStats",
    "ScheduleEvent",
    "ScheduleRecord",
    "Signal",
    "SignalCheck",
    "SignalDelivery",
    "TaskEvent",
    "TaskOutcome",
    "TaskPage",
    "TaskRecord",
    "TaskState",
    "TenantAdmission",
    "TenantBudget",
    "TenantPolicy",
    "TickAttempt",
    "VersionReference",
    "WorkerRecord",
    "WorkflowStore",
    "open_store",
]
