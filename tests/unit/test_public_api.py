"""The names DESIGN §2 imports from the package root are exported there."""

from __future__ import annotations

import runifold_sync


def test_supervisor_names_are_importable_from_the_package_root() -> None:
    from runifold_sync import (
        CancellationToken,
        SupervisorReport,
        WorkflowSupervisor,
        WorkflowSupervisorConfig,
    )

    supervisor = runifold_sync.supervisor
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
