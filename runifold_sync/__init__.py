"""runifold_sync: durable workflows for synchronous Python.

Progress is checkpointed in a store (SQLite on one machine, PostgreSQL for many
processes and hosts), so any compatible worker continues a task after a crash, a deploy,
a timer or a human approval.

The front door is :class:`App` (its :class:`Settings`, the :class:`TaskHandle` a start
returns); beside it the authoring names and the explicit API beneath it. The stores'
records are in :mod:`runifold_sync.store`, what a worker's cycle ends with in
:mod:`runifold_sync.outcomes`, the errors in :mod:`runifold_sync.errors`.
"""

from .app import App, TaskHandle
from .model.cancellation import CancellationToken
from .model.effects import EffectEvidence, EffectStatus
from .model.retry_policy import RetryPolicy
from .model.schedules import Schedule, ScheduleTick
from .model.values import Budget, BudgetUsage, CapabilitySet, LeaseDuration, WorkerId, WorkflowTask
from .pool.retention import RetentionPolicy, keep_pruning
from .pool.supervisor import PoolSettings, SupervisorReport, WorkflowSupervisor, WorkflowSupervisorConfig
from .settings import Settings
from .store.base import WorkflowStore
from .store.open import open_store
from .worker.observer import CycleObserver
from .worker.settings import WorkerSettings
from .worker.worker import WorkerReport, WorkflowWorker
from .workflow.context import WorkflowContext
from .workflow.declaration import Workflow
from .workflow.registry import WorkflowDefinition, WorkflowRegistry
from .workflow.step_context import StepContext
from .workflow.waiting import ApprovalDecision, ApprovalTimedOut, ChildHandle, ChildTimedOut, SignalTimedOut

__version__ = "0.1.0"

__all__ = [
    # the front door
    "App",
    "Settings",
    "TaskHandle",
    "WorkerSettings",
    "PoolSettings",
    # declaring workflows
    "Workflow",
    "WorkflowContext",
    "StepContext",
    "RetryPolicy",
    "EffectEvidence",
    "EffectStatus",
    "BudgetUsage",
    "Schedule",
    "ScheduleTick",
    "ChildHandle",
    "ChildTimedOut",
    "ApprovalDecision",
    "ApprovalTimedOut",
    "SignalTimedOut",
    # the explicit API beneath the App
    "WorkflowDefinition",
    "WorkflowRegistry",
    "WorkflowTask",
    "WorkflowWorker",
    "WorkerReport",
    "WorkflowSupervisor",
    "WorkflowSupervisorConfig",
    "SupervisorReport",
    "CancellationToken",
    "Budget",
    "CapabilitySet",
    "LeaseDuration",
    "WorkerId",
    "CycleObserver",
    "RetentionPolicy",
    "keep_pruning",
    # the stores
    "open_store",
    "WorkflowStore",
]
