"""Registered definitions: exact (name, version) pairs a worker can continue."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs

from .errors import DefinitionConflict, InvalidArgument
from .models import Budget, CapabilitySet, DefinitionIdentity
from .workflow import Workflow


@attrs.frozen
class WorkflowDefinition:
    """A workflow with the budget and capabilities it runs under. Construction checks
    that every step's declared capabilities are granted."""

    workflow: Workflow
    budget: Budget = attrs.field(factory=Budget)
    capabilities: CapabilitySet = attrs.field(factory=CapabilitySet)
    # sender_policy(sender, signal name, payload) -> accept? Refusals are kept in history.
    sender_policy: Callable[[str, str, Any], bool] | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.workflow, Workflow):
            raise InvalidArgument(f"expected a Workflow, got {self.workflow!r}")
        if self.workflow.main_fn is None:
            raise InvalidArgument(f"{self.workflow!r} has no @main function")
        for step_id in self.workflow.compensations:
            if step_id not in self.workflow.steps:
                raise InvalidArgument(
                    f"{self.workflow!r} declares a compensation for {step_id!r}, which is not one of "
                    f"its steps or effects"
                )
        for spec in self.workflow.steps.values():
            missing = self.capabilities.missing(spec.capabilities)
            if missing:
                raise InvalidArgument(
                    f"{spec.kind} {spec.step_id!r} of {self.workflow!r} needs capabilities "
                    f"{missing} that the definition's CapabilitySet does not grant"
                )

    @property
    def identity(self) -> DefinitionIdentity:
        return DefinitionIdentity(self.workflow.name, self.workflow.version, self.workflow.fingerprint())


class WorkflowRegistry:
    """Holds every definition version this process can continue. Keep old versions
    registered while queued, leased, waiting or recoverable tasks reference them."""

    def __init__(self) -> None:
        self._definitions: dict[tuple[str, int], WorkflowDefinition] = {}

    def register(self, definition: WorkflowDefinition) -> None:
        if not isinstance(definition, WorkflowDefinition):
            raise InvalidArgument(f"expected a WorkflowDefinition, got {definition!r}")
        ident = definition.identity
        key = (ident.name, ident.version)
        existing = self._definitions.get(key)
        if existing is not None and existing.identity.fingerprint != ident.fingerprint:
            raise DefinitionConflict(
                f"{ident.name!r} version {ident.version} is already registered with "
                f"fingerprint {existing.identity.fingerprint}; the new one has "
                f"{ident.fingerprint}. Changed steps need a new version."
            )
        self._definitions[key] = definition

    def get(self, name: str, version: int) -> WorkflowDefinition | None:
        return self._definitions.get((name, version))

    def __iter__(self) -> Iterator[WorkflowDefinition]:
        return iter(self._definitions.values())

    def __len__(self) -> int:
        return len(self._definitions)
