"""Validated value types shared by authoring code, workers and stores.

Each constructor rejects bad input with :class:`InvalidArgument` naming the value, so a
mistake surfaces where it was made instead of later inside a worker.
"""

from __future__ import annotations

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


class TaskOptions(TypedDict, total=False):
    """The keyword options of :meth:`WorkflowTask.new`, for the functions that pass
    them on (``WorkflowRegistry.task``, the Flask and Django ``enqueue``) so each option
    is named, typed and defaulted in one place."""

    tenant: str
    checkpoint_id: str | None
    priority: int
    not_before: datetime | None
    queue: str


@attrs.frozen
class WorkflowTask:
    """A request to run one definition version on one input, identified by its
    checkpoint identity (``task_id``). Every field is checked where the task is made
    (:meth:`new`, the class called directly, ``attrs.evolve``), so a store trusts any
    WorkflowTask it is given; ``input_json`` is the canonical JSON text :meth:`new` makes
    of the input. Neither checks that a definition of that name and version exists or
    that the input fits it: ``WorkflowRegistry.task`` checks both."""

    task_id: str = validate.field(validate.name, name="task id")
    definition_name: str = validate.field(validate.name, name="workflow name")
    definition_version: int = validate.field(validate.version, name="version")
    input_json: str = validate.field(validate.is_a(str))
    tenant: str = validate.field(validate.name)
    priority: int = validate.field(validate.stored_int)
    not_before: datetime | None = validate.field(validate.optional(validate.moment))
    # The task that started this one as its child (``ctx.start_child``), else None.
    parent_id: str | None = validate.field(validate.optional(validate.name), None, name="parent id")
    # The named queue it goes on: only workers claiming from that queue take it.
    queue: str = validate.field(validate.name, "default")
    # What the registry that checked the task knows of its definition (set by
    # ``WorkflowRegistry.task``); the store records it with the task. Not part of what
    # the task is: enqueue's idempotency compares the fields above.
    declared: DeclaredSignals | None = validate.field(
        validate.optional(validate.is_a(DeclaredSignals)), None, eq=False, repr=False
    )

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
    ) -> WorkflowTask:
        task_id = uuid.uuid4().hex if checkpoint_id is None else validate.name("checkpoint id", checkpoint_id)
        return cls(task_id, name, version, input_text(input), tenant, priority, not_before, queue=queue)


def input_text(input: Any) -> str:
    """The canonical JSON text of a workflow input, refused (naming the input) when it is
    not JSON, nests past :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH` or is over
    :data:`MAX_INPUT_BYTES` encoded: what a worker could not decode or a store keep."""
    return validate.json_text(
        "workflow input", input, limit=MAX_INPUT_BYTES, instead="store it outside and pass its id"
    )
