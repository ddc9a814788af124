"""Validated value types shared by authoring code, workers and stores.

Each constructor rejects bad input with :class:`InvalidArgument` naming the value, so a
mistake surfaces where it was made instead of later inside a worker.
"""

from __future__ import annotations

import contextvars
import enum
import math
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypedDict

import attrs

from ..errors import InvalidArgument
from . import validate

MAX_INPUT_BYTES = 1 << 20
_worker_id = validate.matching(
    r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}",
    "1-128 characters of letters, digits and ._:@- starting with a letter or digit",
)


class TaskState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    WAITING = "waiting"
    TERMINAL = "terminal"
    CANCELLED = "cancelled"


class TaskOutcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"


@attrs.frozen
class DefinitionIdentity:
    """What a checkpoint was written by; a checkpoint is only continued by the same."""

    name: str
    version: int
    fingerprint: str


@attrs.frozen
class DeclaredSignals:
    """The signal names a definition version declares, as a store keeps them: told by a
    registry (at enqueue, or when a worker serving it starts), the store can refuse a
    misspelt name where it is sent instead of keeping it until a wait refuses it."""

    definition: DefinitionIdentity
    names: frozenset[str]


@attrs.frozen
class WorkerId:
    value: str

    @classmethod
    def parse(cls, text: str) -> WorkerId:
        return cls(_worker_id("worker id", text))

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class LeaseDuration:
    value: timedelta = validate.field(validate.positive_duration, name="lease duration")

    @property
    def seconds(self) -> float:
        return self.value.total_seconds()


# Each Budget limit takes only its own type: a limit of the wrong kind compares against
# usage without error (``steps > 1.5``) or fails inside a worker (an int has no
# ``total_seconds``), so it is refused where the Budget is made, naming the field.


@attrs.frozen
class BudgetUsage:
    """What a task has consumed so far; every field only ever grows."""

    steps: int = 0
    cost: float = 0.0
    elapsed_s: float = 0.0
    claims: int = 0

    def add(
        self, *, steps: int = 0, cost: float = 0.0, elapsed_s: float = 0.0, claims: int = 0
    ) -> BudgetUsage:
        if min(steps, cost, claims) < 0:
            raise InvalidArgument(f"usage only grows; got steps={steps} cost={cost} claims={claims}")
        elapsed = self.elapsed_s + max(elapsed_s, 0.0)
        if not math.isfinite(elapsed):
            raise InvalidArgument(
                f"usage elapsed_s must stay finite, "
                f"got {validate.shown(elapsed_s)} added to {self.elapsed_s!r}"
            )
        return BudgetUsage(
            self.steps + steps,
            validate.cost("cost", cost, self.cost),
            elapsed,
            self.claims + claims,
        )

    def spent(self, steps: int, cost: float, elapsed_s: float) -> BudgetUsage:
        """This usage plus what the engine counted itself: steps it ran, a cost that
        ``StepContext.charge`` checked, and a monotonic interval (never negative, so only
        the total cost is checked, to stay finite). :meth:`add`, which checks each value,
        is for values from anywhere else; this one runs at every step."""
        total = self.cost if not cost else validate.cost("cost", cost, self.cost)
        return BudgetUsage(self.steps + steps, total, self.elapsed_s + elapsed_s, self.claims)

    def claimed(self) -> BudgetUsage:
        """This usage with one more claim: at the start of every claim's run."""
        return BudgetUsage(self.steps, self.cost, self.elapsed_s, self.claims + 1)

    def covers(self, other: BudgetUsage) -> bool:
        """True when no field of ``self`` is below ``other``'s (usage never decreased)."""
        return (
            self.steps >= other.steps
            and self.cost >= other.cost
            and self.elapsed_s >= other.elapsed_s
            and self.claims >= other.claims
        )


@attrs.frozen
class Budget:
    """Limits on one task's run, checked before each step and after each commit; the
    task fails with a reason naming the limit it went over.

    ``max_duration`` is the task's run time: wall time while a worker held it, from each
    claim to the end of that claim's cycle, summed over claims (the time between steps in
    the main function counts; time queued, waiting on a timer or signal, or lost with a
    crashed worker after its last commit does not). Use wait timeouts to bound waits.
    ``max_attempts`` counts claims that made no progress, which is how a task that
    crashes its worker every time (a poison task) is stopped."""

    max_steps: int | None = validate.field(validate.optional(validate.count), None, prefix=True)
    max_cost: float | None = validate.field(validate.optional(validate.number), None, prefix=True)
    max_duration: timedelta | None = validate.field(
        validate.optional(validate.positive_duration), None, prefix=True
    )
    max_attempts: int = validate.field(validate.count, 5, prefix=True)

    def limits_usage(self) -> bool:
        """True when any limit applies to usage (steps, cost or duration)."""
        return self.max_steps is not None or self.max_cost is not None or self.max_duration is not None

    def exceeded(self, usage: BudgetUsage) -> str | None:
        """The limit ``usage`` is over, described for a failure reason, or None."""
        if self.max_steps is not None and usage.steps > self.max_steps:
            return f"budget max_steps={self.max_steps} exceeded ({usage.steps} steps)"
        if self.max_cost is not None and usage.cost > self.max_cost:
            return f"budget max_cost={self.max_cost} exceeded (cost {usage.cost:g})"
        if self.max_duration is not None and usage.elapsed_s > self.max_duration.total_seconds():
            return f"budget max_duration={self.max_duration} exceeded ({usage.elapsed_s:.3f}s of run time)"
        return None


def _capability_names(names: object) -> frozenset[str]:
    return validate.names("capabilities", names, kind="capability")


@attrs.frozen
class CapabilitySet:
    names: frozenset[str] = attrs.field(default=frozenset(), converter=_capability_names)

    def missing(self, needed: Iterable[str]) -> list[str]:
        return sorted(set(needed) - self.names)


class FlowOptions(TypedDict, total=False):
    """The flow options of an enqueue (``model.flow``): the concurrency key its limits
    count it under, and what the enqueue does when tasks share its dedup or debounce key."""

    concurrency_key: str | None
    dedup_key: str | None
    dedup_window: timedelta | None
    singleton: bool
    replace: bool
    debounce: timedelta | None
    debounce_key: str | None
    debounce_max: timedelta | None


class TaskOptions(TypedDict, total=False):
    """The keyword options of :meth:`WorkflowTask.new`, for the functions that pass
    them on (``WorkflowRegistry.task``, the Flask and Django ``enqueue``) so each option
    is named, typed and defaulted in one place."""

    tenant: str
    checkpoint_id: str | None
    priority: int
    not_before: datetime | None
    queue: str
    # FlowOptions' keys, repeated so the task's own come first (the documented order).
    concurrency_key: str | None
    dedup_key: str | None
    dedup_window: timedelta | None
    singleton: bool
    replace: bool
    debounce: timedelta | None
    debounce_key: str | None
    debounce_max: timedelta | None


@attrs.frozen
class EnqueueFlow:
    """What an enqueue does when other tasks share its key: a task with the same
    ``dedup_key`` created within ``dedup_window`` is returned instead of a new one; with
    ``singleton`` an unfinished task of the key is returned (or, with ``replace``, cancelled
    and the new one enqueued); with ``debounce`` the queued task of ``debounce_key`` takes
    this input and waits ``debounce`` more (at most ``debounce_max`` after the first).
    Each field is checked, and the fields together, where it is made."""

    dedup_key: str | None = validate.field(validate.optional(validate.name), None)
    dedup_window: timedelta | None = validate.field(validate.optional(validate.positive_duration), None)
    singleton: bool = validate.field(validate.flag, False)
    replace: bool = validate.field(validate.flag, False)
    debounce: timedelta | None = validate.field(validate.optional(validate.positive_duration), None)
    debounce_key: str | None = validate.field(validate.optional(validate.name), None)
    debounce_max: timedelta | None = validate.field(validate.optional(validate.positive_duration), None)

    @debounce_max.validator
    def _together(self, _attribute: attrs.Attribute[Any], _value: Any) -> None:
        """The rules between fields, run after each field's own check (attrs runs the
        validators in field order, once every field is set)."""
        if (self.dedup_window is not None or self.singleton) and self.dedup_key is None:
            raise InvalidArgument("dedup_window and singleton=True need a dedup_key, got dedup_key=None")
        if self.dedup_window is not None and self.singleton:
            raise InvalidArgument("dedup_window and singleton=True are two ways to dedup; give one of them")
        if self.replace and not self.singleton:
            raise InvalidArgument(
                "replace=True replaces a singleton's existing task; it needs singleton=True"
            )
        if self.debounce is None:
            if self.debounce_key is not None or self.debounce_max is not None:
                raise InvalidArgument("debounce_key and debounce_max need debounce, got debounce=None")
            return
        if self.debounce_key is None:
            raise InvalidArgument("debounce needs a debounce_key, got debounce_key=None")
        if self.dedup_key is not None:
            raise InvalidArgument(
                "debounce and dedup_key are two ways to collapse enqueues; give one of them"
            )
        if self.debounce_max is not None and self.debounce_max < self.debounce:
            validate.refuse("debounce_max", f"at least debounce ({self.debounce})", self.debounce_max)

    @property
    def any(self) -> bool:
        return self.dedup_key is not None or self.debounce is not None


# The input text WorkflowTask.new just made canonical, or that the task being changed
# holds (checked when it was made): its field check passes that very object without
# decoding it again. Per thread (and per asyncio task), so no other call sees it.
_checked_input: contextvars.ContextVar[str | None] = contextvars.ContextVar("checked_input", default=None)


def _input_json(field: str, value: object) -> str:
    checked = _checked_input.get()
    if checked is not None and value is checked:
        return checked
    return validate.canonical_json(field, value, limit=MAX_INPUT_BYTES)


@attrs.frozen
class WorkflowTask:
    """A request to run one definition version on one input, identified by its
    checkpoint identity (``task_id``). Every field is checked where the task is made
    (:meth:`new`, the class called directly, :meth:`evolve`, ``attrs.evolve``), so a
    store trusts any WorkflowTask it is given. ``input_json`` is canonical JSON text (the
    text :meth:`new` makes of the input, which it does not decode again): text a worker
    could not decode, or that two backends would keep differently, is refused here rather
    than failing the task later inside a worker. Neither checks that a definition of that
    name and version exists or that the input fits it: ``WorkflowRegistry.task`` checks both."""

    task_id: str = validate.field(validate.name, name="task id")
    definition_name: str = validate.field(validate.name, name="workflow name")
    definition_version: int = validate.field(validate.version, name="version")
    input_json: str = validate.field(_input_json)
    tenant: str = validate.field(validate.name)
    priority: int = validate.field(validate.stored_int)
    not_before: datetime | None = validate.field(validate.optional(validate.moment))
    # The task that started this one as its child (``ctx.start_child``), else None.
    parent_id: str | None = validate.field(validate.optional(validate.name), None, name="parent id")
    # The named queue it goes on: only workers claiming from that queue take it.
    queue: str = validate.field(validate.name, "default")
    # A child (parent_id set) that cancelling its parent does not cancel
    # (``ctx.start_child(..., detached=True)``).
    detached: bool = validate.field(validate.flag, False)
    # What the registry that checked the task knows of its definition (set by
    # ``WorkflowRegistry.task``); the store records it with the task. Not part of what
    # the task is: enqueue's idempotency compares the fields above.
    declared: DeclaredSignals | None = validate.field(
        validate.optional(validate.is_a(DeclaredSignals)), None, eq=False, repr=False
    )
    # The group its concurrency and rate limits count it in (``model.flow``), else None.
    concurrency_key: str | None = validate.field(validate.optional(validate.name), None)
    # What the enqueue does when tasks share its dedup or debounce key (``model.flow``):
    # how it is enqueued, not what it is.
    flow: EnqueueFlow | None = validate.field(validate.optional(validate.is_a(EnqueueFlow)), None, eq=False)

    @detached.validator
    def _only_a_child_detaches(self, _attribute: attrs.Attribute[Any], detached: bool) -> None:
        if detached and self.parent_id is None:
            raise InvalidArgument(f"task {self.task_id!r} is detached with no parent: only a child detaches")

    @classmethod
    def new(
        cls,
        name: str,
        version: int,
        input: Any,
        *,
        tenant: str = "default",
        checkpoint_id: str | None = None,
        priority: int = 0,
        not_before: datetime | None = None,
        queue: str = "default",
        concurrency_key: str | None = None,
        dedup_key: str | None = None,
        dedup_window: timedelta | None = None,
        singleton: bool = False,
        replace: bool = False,
        debounce: timedelta | None = None,
        debounce_key: str | None = None,
        debounce_max: timedelta | None = None,
    ) -> WorkflowTask:
        task_id = uuid.uuid4().hex if checkpoint_id is None else validate.name("checkpoint id", checkpoint_id)
        flow = EnqueueFlow(dedup_key, dedup_window, singleton, replace, debounce, debounce_key, debounce_max)
        text = input_text(input)
        made = _checked_input.set(text)  # canonical already: not decoded again by its field check
        try:
            return cls(
                task_id,
                name,
                version,
                text,
                tenant,
                priority,
                not_before,
                queue=queue,
                concurrency_key=concurrency_key,
                flow=flow if flow.any else None,
            )
        finally:
            _checked_input.reset(made)

    def evolve(self, **changes: Any) -> WorkflowTask:
        """This task with ``changes`` (``attrs.evolve``), each checked as the constructor
        checks it; the input text it already holds was checked when it was made, so it
        is not decoded again unless ``changes`` replace it."""
        kept = _checked_input.set(self.input_json)
        try:
            return attrs.evolve(self, **changes)
        finally:
            _checked_input.reset(kept)


def input_text(input: Any) -> str:
    """The canonical JSON text of a workflow input, refused (naming the input) when it is
    not JSON, nests past :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH` or is over
    :data:`MAX_INPUT_BYTES` encoded: what a worker could not decode or a store keep."""
    return validate.json_text(
        "workflow input", input, limit=MAX_INPUT_BYTES, instead="store it outside and pass its id"
    )
