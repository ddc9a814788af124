"""Registered definitions: exact (name, version) pairs a worker can continue."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Unpack

import attrs

from ..errors import DefinitionConflict, InvalidArgument, UnknownDefinition
from ..model import validate
from ..model.codec import from_json
from ..model.inputs import fit_input
from ..model.schedules import Schedule
from ..model.values import (
    Budget,
    CapabilitySet,
    DeclaredSignals,
    DefinitionIdentity,
    TaskOptions,
    WorkflowTask,
)
from .declaration import Workflow

# The fields a worker reads only once it runs a task of the definition: a value of the
# wrong type there would be accepted at registration and fail every task later, inside a
# worker (a budget without ``exceeded``, a policy that cannot be called), so each is
# checked where the definition is made.


def _check_sender_policy(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        raise InvalidArgument(
            f"WorkflowDefinition.{attribute.name} must be None or a callable "
            f"(sender, signal name, payload) -> bool, got {validate.shown(value)}"
        )


def _key_function(field: str, value: object) -> Callable[[Any], str]:
    if not callable(value):
        validate.refuse(field, "a function of the input", value)
    return value


@attrs.frozen
class WorkflowDefinition:
    """A workflow with the budget and capabilities it runs under. Construction checks
    each field's type (:class:`InvalidArgument` naming it) and that every step's
    declared capabilities are granted."""

    workflow: Workflow
    budget: Budget = validate.field(validate.is_a(Budget), attrs.Factory(Budget), prefix=True)
    capabilities: CapabilitySet = validate.field(
        validate.is_a(CapabilitySet), attrs.Factory(CapabilitySet), prefix=True
    )
    # sender_policy(sender, signal name, payload) -> accept? Refusals are kept in history.
    sender_policy: Callable[[str, str, Any], bool] | None = attrs.field(
        default=None, validator=_check_sender_policy
    )
    # True: structure the input as cattrs' converter does ("7" for an int becomes 7, 1 for
    # a str becomes "1", keys the class lacks are dropped) instead of strictly.
    coerce_input: bool = validate.field(validate.flag, False, prefix=True)
    # concurrency_key(input) -> the concurrency key of a task started without one (its
    # input as the main function takes it): the group its flow limits count it in.
    concurrency_key: Callable[[Any], str] | None = validate.field(
        validate.optional(_key_function), None, prefix=True
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.workflow, Workflow):
            raise InvalidArgument(f"expected a Workflow, got {validate.shown(self.workflow)}")
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

    @property
    def declared_signals(self) -> DeclaredSignals:
        return DeclaredSignals(self.identity, self.workflow.signals)

    def structure_input(self, raw: Any, what: str = "input") -> Any:
        """``raw`` (decoded JSON) as the main function's input type: strictly, unless
        ``coerce_input``; :class:`InputMismatch` names every field that does not fit."""
        return fit_input(raw, self.workflow.input_type(), coerce=self.coerce_input, what=what)


def _versions(versions: list[int]) -> str:
    return ("version " if len(versions) == 1 else "versions ") + ", ".join(map(str, versions))


class WorkflowRegistry:
    """Holds every definition version this process can continue. Keep old versions
    registered while queued, leased, waiting or recoverable tasks reference them."""

    def __init__(self) -> None:
        self._definitions: dict[tuple[str, int], WorkflowDefinition] = {}
        self._schedules: dict[str, Schedule] = {}
        # Counts registrations, so a worker knows when to recompute what it serves.
        self.revision = 0

    def register(self, definition: WorkflowDefinition) -> None:
        if not isinstance(definition, WorkflowDefinition):
            raise InvalidArgument(f"expected a WorkflowDefinition, got {validate.shown(definition)}")
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
        self.revision += 1

    def get(self, name: str, version: int) -> WorkflowDefinition | None:
        return self._definitions.get((name, version))

    def task(self, name: str, version: int, input: Any, **options: Unpack[TaskOptions]) -> WorkflowTask:
        """A task of ``name`` at ``version``, checked against this registry: the version
        is registered (:class:`UnknownDefinition` names those that are) and ``input``
        fits the main function's annotation (:class:`InputMismatch` names every wrong
        field). The task carries the definition's declared signals, which the store
        records when it is enqueued, so a misspelt signal name is refused when sent.
        The stored input is ``input`` as given, so a task made with or without the
        registry is the same task to enqueue's idempotency."""
        task = WorkflowTask.new(name, version, input, **options)
        definition = self.get(name, version)
        if definition is None:
            raise self._unknown(name, version)
        structured = definition.structure_input(
            from_json(task.input_json), f"input of {name!r} version {version}"
        )
        if definition.concurrency_key is not None and task.concurrency_key is None:
            key = validate.name(
                f"concurrency key that {name!r} computed from its input",
                definition.concurrency_key(structured),
            )
            return task.evolve(concurrency_key=key, declared=definition.declared_signals)
        return task.evolve(declared=definition.declared_signals)

    def add_schedule(self, schedule: Schedule) -> None:
        """Run ``schedule`` wherever a worker of this registry runs (``WorkflowWorker.run``,
        every process of a pool). Its workflow version must be registered first, and the
        input its ticks carry must fit that version's main function
        (:class:`UnknownDefinition`, :class:`InputMismatch`), so a schedule that could
        only make failing tasks is refused here. A name is added once."""
        if not isinstance(schedule, Schedule):
            raise InvalidArgument(f"expected a Schedule, got {validate.shown(schedule)}")
        if schedule.name in self._schedules:
            raise InvalidArgument(f"a schedule named {schedule.name!r} is already added to this registry")
        sample = schedule.times.next_after(datetime.now(UTC))
        self.tick_task(schedule, sample)
        self._schedules[schedule.name] = schedule

    def tick_task(self, schedule: Schedule, tick: datetime) -> WorkflowTask:
        """The task of ``schedule``'s tick at ``tick``, checked as :meth:`task` checks."""
        return self.task(
            schedule.workflow,
            schedule.version,
            schedule.tick_input(tick),
            checkpoint_id=schedule.task_id(tick),
            queue=schedule.queue,
        )

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules added, by name."""
        return tuple(self._schedules[name] for name in sorted(self._schedules))

    def _unknown(self, name: str, version: int) -> UnknownDefinition:
        registered: dict[str, list[int]] = {}
        for known_name, known_version in sorted(self._definitions):
            registered.setdefault(known_name, []).append(known_version)
        if name in registered:
            return UnknownDefinition(
                name,
                version,
                registered,
                f"{name!r} has no version {version} in this registry, only {_versions(registered[name])}",
            )
        listed = "; ".join(f"{n!r} ({_versions(v)})" for n, v in registered.items()) or "no definitions"
        close = difflib.get_close_matches(str(name), registered, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return UnknownDefinition(
            name,
            version,
            registered,
            f"no workflow named {name!r} is registered; this registry has {listed}.{hint}",
        )

    def __iter__(self) -> Iterator[WorkflowDefinition]:
        return iter(self._definitions.values())

    def __len__(self) -> int:
        return len(self._definitions)
