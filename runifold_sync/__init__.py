"""runifold_sync: durable workflows for synchronous Python.

Progress is checkpointed in a store (SQLite on one machine, PostgreSQL for many
processes and hosts), so any compatible worker continues a task after a crash, a deploy,
a timer or a human approval.
"""

from .admission import TenantAdmission, TenantBudget, TenantPolicy
from .cancellation import CancellationToken
from .context import WorkflowContext
from .definition import WorkflowDefinition, WorkflowRegistry
from .effects import EffectEvidence, EffectStatus
from .errors import (
    AmbiguousEffect,
    CancelPending,
    CheckpointError,
    CheckpointTooLarge,
    DefinitionConflict,
    EnqueueConflict,
    FingerprintMismatch,
    InvalidArgument,
    InvalidState,
    LeaseLostError,
    NonDeterminism,
    OutputNotSerializable,
    RunifoldError,
    SchemaTooNew,
    SignalConflict,
    SignalRefused,
    StoreClosed,
    StoreNotWritable,
    StoreUnavailable,
    StoreUsedAcrossFork,
    TaskNotFound,
    WorkerIdInUse,
)
from .models import (
    Budget,
    BudgetUsage,
    CapabilitySet,
    DefinitionIdentity,
    LeaseDuration,
    RetryPolicy,
    TaskOutcome,
    TaskState,
    WorkerId,
    WorkflowTask,
)
from .outcomes import (
    Cancelled,
    Completed,
    ContinuedAsNew,
    DefinitionUnavailable,
    Failed,
    FailureDetail,
    Idle,
    LeaseLost,
    Retried,
    RunOutcome,
    Suspended,
    Yielded,
)
from .step_context import StepContext
from .store.base import WorkflowStore
from .store.records import Lease, TaskEvent, TaskRecord
from .stores import open_store
from .supervisor import SupervisorReport, WorkflowSupervisor, WorkflowSupervisorConfig
from .waits import ApprovalDecision, ApprovalTimedOut, SignalTimedOut
from .worker import WorkerReport, WorkflowWorker
from .worker_settings import WorkerSettings
from .workflow import Workflow

__all__ = [
    "AmbiguousEffect",
    "ApprovalDecision",
    "ApprovalTimedOut",
    "Budget",
    "BudgetUsage",
    "CancelPending",
    "CancellationToken",
    "Cancelled",
    "CapabilitySet",
    "CheckpointError",
    "CheckpointTooLarge",
    "Completed",
    "ContinuedAsNew",
    "DefinitionConflict",
    "DefinitionIdentity",
    "DefinitionUnavailable",
    "EffectEvidence",
    "EffectStatus",
    "EnqueueConflict",
    "Failed",
    "FailureDetail",
    "FingerprintMismatch",
    "Idle",
    "InvalidArgument",
    "InvalidState",
    "Lease",
    "LeaseDuration",
    "LeaseLost",
    "LeaseLostError",
    "NonDeterminism",
    "OutputNotSerializable",
    "Retried",
    "RetryPolicy",
    "RunOutcome",
    "RunifoldError",
    "SchemaTooNew",
    "SignalConflict",
    "SignalRefused",
    "SignalTimedOut",
    "StepContext",
    "StoreClosed",
    "StoreNotWritable",
    "StoreUnavailable",
    "StoreUsedAcrossFork",
    "WorkerIdInUse",
    "SupervisorReport",
    "Suspended",
    "TaskEvent",
    "TaskNotFound",
    "TaskOutcome",
    "TaskRecord",
    "TaskState",
    "TenantAdmission",
    "TenantBudget",
    "TenantPolicy",
    "WorkerId",
    "WorkerReport",
    "WorkerSettings",
    "Workflow",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowRegistry",
    "WorkflowStore",
    "WorkflowSupervisor",
    "WorkflowSupervisorConfig",
    "WorkflowTask",
    "WorkflowWorker",
    "Yielded",
    "open_store",
]
