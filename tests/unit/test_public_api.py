"""The names DESIGN §2 imports from the package root are exported there."""

from __future__ import annotations

import typing

import runifold_sync
from runifold_sync import WorkflowStore


def test_supervisor_names_are_importable_from_the_package_root() -> None:
    from runifold_sync import (
        CancellationToken,
        SupervisorReport,
        WorkflowSupervisor,
        WorkflowSupervisorConfig,
    )

    supervisor = runifold_sync.pool.supervisor
    assert (CancellationToken, SupervisorReport, WorkflowSupervisor, WorkflowSupervisorConfig) == (
        supervisor.CancellationToken,
        supervisor.SupervisorReport,
        supervisor.WorkflowSupervisor,
        supervisor.WorkflowSupervisorConfig,
    )


def test_design_section_2_import_list_is_public() -> None:
    design_names = [
        "Workflow",
        "WorkflowDefinition",
        "WorkflowRegistry",
        "WorkflowTask",
        "WorkflowWorker",
        "WorkflowSupervisor",
        "WorkflowSupervisorConfig",
        "CancellationToken",
        "Budget",
        "CapabilitySet",
        "LeaseDuration",
        "WorkerId",
    ]
    missing = [n for n in design_names if n not in runifold_sync.__all__ or not hasattr(runifold_sync, n)]
    assert missing == []
    assert all(hasattr(runifold_sync, n) for n in runifold_sync.__all__)


def _named_classes(annotation: object) -> set[type]:
    """The runifold_sync classes an annotation names, inside list[...], X | None and such."""
    found: set[type] = set()
    if isinstance(annotation, type) and annotation.__module__.startswith("runifold_sync"):
        found.add(annotation)
    for arg in typing.get_args(annotation):
        found |= _named_classes(arg)
    return found


# What an application or an operator's script calls on a store (the documented methods),
# as against the worker's own (claim, commit_checkpoint, ...), whose records stay internal.
APPLICATION_METHODS = (
    "enqueue",
    "enqueue_many",
    "get_task",
    "list_tasks",
    "list_tasks_page",
    "wait_for_task",
    "history",
    "send_signal",
    "pending_signals",
    "published_events",
    "queue_stats",
    "referenced_versions",
    "workers",
    "clock_reading",
    "tenant_admission",
    "schedules",
    "schedule_history",
)


def test_what_the_stores_application_methods_return_is_importable_from_the_package_root() -> None:
    """A caller can annotate what it gets back (``enqueue``'s ``EnqueueResult``,
    ``workers``' ``WorkerRecord`` ...) without importing from internal modules."""
    returned: set[type] = set()
    for name in APPLICATION_METHODS:
        returned |= _named_classes(typing.get_type_hints(getattr(WorkflowStore, name)).get("return"))
    assert {"EnqueueResult", "TaskRecord", "WorkerRecord", "QueueStats", "TaskPage", "Signal"} <= {
        c.__name__ for c in returned
    }
    missing = sorted(c.__name__ for c in returned if getattr(runifold_sync, c.__name__, None) is not c)
    assert missing == []
