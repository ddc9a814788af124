"""The public names: the package root (the front door, the authoring names, the seed's
explicit API of DESIGN §2, the stores' opener: at most 40), ``__version__``, and the
records, outcomes and errors reached through ``runifold_sync.store``,
``runifold_sync.outcomes`` and ``runifold_sync.errors``."""

from __future__ import annotations

import importlib.metadata
import typing

import runifold_sync
import runifold_sync.errors
import runifold_sync.outcomes
import runifold_sync.store
from runifold_sync import WorkflowStore
from runifold_sync.model import outcomes as model_outcomes


def test_the_root_exports_at_most_40_names_each_of_them_importable() -> None:
    assert len(runifold_sync.__all__) <= 40
    assert len(set(runifold_sync.__all__)) == len(runifold_sync.__all__)
    assert all(hasattr(runifold_sync, n) for n in runifold_sync.__all__)
    assert {"App", "Settings", "TaskHandle", "open_store"} <= set(runifold_sync.__all__)


def test_the_version_is_the_installed_packages() -> None:
    assert runifold_sync.__version__ == importlib.metadata.version("runifold_sync")


def test_supervisor_names_are_importable_from_the_package_root() -> None:
    from runifold_sync import (
        CancellationToken,
        PoolSettings,
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
    assert WorkflowSupervisorConfig is PoolSettings


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


def test_the_outcomes_module_exports_every_outcome_of_a_cycle() -> None:
    kinds = {
        name
        for name, value in vars(model_outcomes).items()
        if isinstance(value, type) and issubclass(value, model_outcomes.RunOutcome)
    }
    assert kinds <= set(runifold_sync.outcomes.__all__)
    assert all(getattr(runifold_sync.outcomes, n) is getattr(model_outcomes, n) for n in kinds)


def test_the_errors_module_holds_every_error_the_package_raises_by_name() -> None:
    """Each RunifoldError subclass a caller catches is in ``runifold_sync.errors``, the
    metrics endpoint's and the timed-out task's too."""
    names = {n for n, v in vars(runifold_sync.errors).items() if isinstance(v, type)}
    assert {"RunifoldError", "InvalidArgument", "MetricsUnavailable", "TaskFailed", "ForkUnsafe"} <= names


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


def test_what_the_stores_application_methods_return_is_importable_from_runifold_sync_store() -> None:
    """A caller can annotate what it gets back (``enqueue``'s ``EnqueueResult``,
    ``workers``' ``WorkerRecord`` ...) without importing from internal modules."""
    returned: set[type] = set()
    for name in APPLICATION_METHODS:
        returned |= _named_classes(typing.get_type_hints(getattr(WorkflowStore, name)).get("return"))
    assert {"EnqueueResult", "TaskRecord", "WorkerRecord", "QueueStats", "TaskPage", "Signal"} <= {
        c.__name__ for c in returned
    }
    missing = sorted(c.__name__ for c in returned if getattr(runifold_sync.store, c.__name__, None) is not c)
    assert missing == []
    assert set(runifold_sync.store.__all__) <= set(dir(runifold_sync.store))
