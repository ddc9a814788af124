"""Every name a user gives runifold_sync is refused empty at the call that received it,
with an InvalidArgument (a ValueError) naming the field and the value."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from runifold_sync import CapabilitySet, WorkerId, Workflow, WorkflowTask
from runifold_sync.errors import InvalidArgument


def _step_with_empty_id() -> None:
    Workflow("orders", 1).step("")


def _effect_with_empty_id() -> None:
    Workflow("orders", 1).effect("", idempotent=True)


def _step_needing_an_empty_capability() -> None:
    Workflow("orders", 1).step("reserve", capabilities=[""])


CASES: dict[str, tuple[Callable[[], object], str]] = {
    "workflow name": (lambda: Workflow("", 1), "workflow name"),
    "task definition name": (lambda: WorkflowTask.new("", 1, {}), "workflow name"),
    "checkpoint id": (lambda: WorkflowTask.new("orders", 1, {}, checkpoint_id=""), "checkpoint id"),
    "tenant": (lambda: WorkflowTask.new("orders", 1, {}, tenant=""), "tenant"),
    "worker id": (lambda: WorkerId.parse(""), "worker id"),
    "step id": (_step_with_empty_id, "step id"),
    "effect id": (_effect_with_empty_id, "effect id"),
    "capability of a set": (lambda: CapabilitySet(frozenset({""})), "capability"),
    "capability of a step": (_step_needing_an_empty_capability, "capability"),
    "declared signal name": (lambda: Workflow("orders", 1, signals=["approval", ""]), "signal name"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_empty_name_is_refused_naming_the_field_and_the_value(case: str) -> None:
    call, field = CASES[case]
    with pytest.raises(InvalidArgument) as info:
        call()
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert field in message and "''" in message, message
