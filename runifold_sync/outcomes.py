"""What one claim-and-execute cycle (``WorkflowWorker.run_once``, ``App.run_once``) ended
with: one of the classes below, all :class:`RunOutcome`, usable with ``match``."""

from .model.outcomes import (
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

__all__ = [
    "Cancelled",
    "Completed",
    "ContinuedAsNew",
    "DefinitionUnavailable",
    "Failed",
    "FailureDetail",
    "Idle",
    "LeaseLost",
    "Retried",
    "RunOutcome",
    "Suspended",
    "Yielded",
]
