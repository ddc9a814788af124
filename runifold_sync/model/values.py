"""Validated value types shared by authoring code, workers and stores.

Each constructor rejects bad input with :class:`InvalidArgument` naming the value, so a
mistake surfaces where it was made instead of later inside a worker.
"""

from __future__ import annotations

import enum
import math
import re
import reprlib
import sys
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypedDict

import attrs

from ..errors import InvalidArgument
from .codec import MAX_NESTING_DEPTH, NestedTooDeep, NotJsonable, to_json
from .moments import check_moment

MAX_INPUT_BYTES = 1 << 20

# Error messages name the offending value, bounded: it may be huge, or nested deeper
# than repr() can follow.
_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 6, 160, 160


def bounded(value: object) -> str:
    """``repr`` for error messages, cut to a readable length (long strings, deep values)."""
    try:
        return _BOUNDED.repr(value)
    except ValueError:  # an integer too long to print: say what it is instead
        return f"of type {type(value).__name__} holding an integer too long to print"


_NAME_MAX = 200
_WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def check_name(kind: str, value: object) -> str:
    """Names become database keys and log fields: printable, trimmed, bounded."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{kind} must be a string, got {value!r}")
    if not value or value != value.strip():
        raise InvalidArgument(f"{kind} must be non-empty without surrounding spaces, got {value!r}")
    if len(value) > _NAME_MAX:
        raise InvalidArgument(f"{kind} is longer than {_NAME_MAX} characters: {value[:40]!r}...")
    if not value.isprintable():
        surrogate = next((ch for ch in value if "\ud800" <= ch <= "\udfff"), None)
        if surrogate is not None:  # no character at all: what undecodable bytes in argv become
            raise InvalidArgument(
                f"{kind} contains a lone surrogate U+{ord(surrogate):04X}, which is not a Unicode "
                f"character (was it made from bytes that are not UTF-8?): {value!r}"
            )
        raise InvalidArgument(f"{kind} contains control characters: {value!r}")
    return value


def check_names(
    field: str, kind: str, names: object, *, shape: str = "an iterable of names"
) -> frozenset[str]:
    """Declared names (signals, capabilities, approvers), each checked as ``kind``: an
    iterable of names, never a string, whose letters iterating would declare one by one
    ("net" as {"n", "e", "t"}). ``shape`` says what ``field`` must be in the refusal."""
    if isinstance(names, str):
        raise InvalidArgument(f"{field} must be {shape}, got the string {names!r}; write [{names!r}]")
    if not isinstance(names, Iterable):
        raise InvalidArgument(f"{field} must be {shape}, got {bounded(names)}")
    return frozenset(check_name(kind, n) for n in names)


# Integers a store keeps are 64-bit (SQLite INTEGER, PostgreSQL BIGINT); durations it
# keeps or adds to its clock stay far inside what a datetime and a 64-bit count of
# microseconds hold. Both bounds are checked where a value is made, so the database never
# sees one it would refuse (PostgreSQL's refusal would read as an outage).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DURATION = timedelta(days=3650)


def shown(value: object) -> str:
    """``repr`` for error messages, bounded: an integer too long to print whole (Python
    refuses past 4,300 digits) is described by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer argument (``bool`` refused, though Python counts it as one) within
    ``minimum``..``maximum`` where given; the error names ``name`` and the value."""
    if isinstance(value, int) and not isinstance(value, bool):
        if (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
            return value
    if minimum is None and maximum is None:
        bounds = ""
    elif maximum is None:
        bounds = f" >= {minimum}"
    elif minimum is None:
        bounds = f" <= {maximum}"
    else:
        bounds = f" in {minimum}..{maximum}"
    raise InvalidArgument(f"{name} must be an integer{bounds}, got {shown(value)}")


def check_stored_int(name: str, value: object, *, minimum: int = INT64_MIN) -> int:
    """An integer a store keeps: within ``minimum``..2**63-1."""
    return check_int(name, value, minimum=minimum, maximum=INT64_MAX)


def check_version(value: object) -> int:
    return check_stored_int("version", value, minimum=1)


def check_positive_timedelta(kind: str, value: object) -> timedelta:
    if not isinstance(value, timedelta):
        raise InvalidArgument(f"{kind} must be a datetime.timedelta, got {value!r}")
    if value <= timedelta(0):
        raise InvalidArgument(f"{kind} must be positive, got {value!r}")
    return check_duration_bound(kind, value)


def check_duration_bound(kind: str, value: timedelta) -> timedelta:
    """A duration a store keeps or adds to its clock: at most :data:`MAX_DURATION` either way."""
    if abs(value) > MAX_DURATION:
        raise InvalidArgument(f"{kind} must be at most {MAX_DURATION.days} days, got {value!r}")
    return value


def seconds_duration(kind: str, seconds: object, *, minimum_s: float) -> timedelta:
    """A duration given in seconds (a CLI option, a setting): a finite number from
    ``minimum_s`` up to :data:`MAX_DURATION`."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not minimum_s <= seconds <= MAX_DURATION.total_seconds()
    ):
        raise InvalidArgument(
            f"{kind} must be a number of seconds from {minimum_s} to {MAX_DURATION.total_seconds():.0f}, "
            f"got {shown(seconds)}"
        )
    return timedelta(seconds=seconds)


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
        if not isinstance(text, str) or not _WORKER_ID.fullmatch(text):
            raise InvalidArgument(
                "worker id must be 1-128 characters of letters, digits and ._:@- "
                f"starting with a letter or digit, got {text!r}"
            )
        return cls(text)

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class LeaseDuration:
    value: timedelta = attrs.field(validator=lambda _i, _a, v: check_positive_timedelta("lease duration", v))

    @property
    def seconds(self) -> float:
        return self.value.total_seconds()


def check_count(kind: str, value: object) -> int:
    """A setting that counts something (attempts, processes, tasks): an integer >= 1."""
    return check_int(kind, value, minimum=1)


_FLOAT_MAX = sys.float_info.max


def check_positive_number(kind: str, value: object) -> float:
    """A finite number > 0 (``bool`` refused). NaN compares false with everything and
    infinity (or an integer past the largest float) is never reached, or overflows where
    usage is subtracted from it: each would make a limit or factor that means nothing."""
    if not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0:
        if value <= _FLOAT_MAX:  # False for NaN and infinity too
            return value
    raise InvalidArgument(f"{kind} must be a finite number > 0, got {shown(value)}")


def check_cost(kind: str, value: object, total: float = 0.0) -> float:
    """``total`` plus a cost (a finite number >= 0, ``bool`` refused), refused when the
    sum is past the largest float: usage is stored as JSON, which has no infinity, so a
    total that overflowed could never be committed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= _FLOAT_MAX:
        raise InvalidArgument(f"{kind} must be a finite number >= 0, got {shown(value)}")
    added = total + float(value)
    if not math.isfinite(added):
        raise InvalidArgument(
            f"{kind} {value!r} added to {total!r} already counted is past the largest float "
            f"({_FLOAT_MAX:g}): a total cost must stay finite"
        )
    return added


# Each Budget limit takes only its own type: a limit of the wrong kind compares against
# usage without error (``steps > 1.5``) or fails inside a worker (an int has no
# ``total_seconds``), so it is refused where the Budget is made, naming the field.


def _optional_count(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        check_count(f"Budget.{attribute.name}", value)


def _optional_cost(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        check_positive_number(f"Budget.{attribute.name}", value)


def _optional_duration(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        check_positive_timedelta(f"Budget.{attribute.name}", value)


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
                f"usage elapsed_s must stay finite, got {elapsed_s!r} added to {self.elapsed_s!r}"
            )
        return BudgetUsage(
            self.steps + steps,
            check_cost("cost", cost, self.cost),
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

    max_steps: int | None = attrs.field(default=None, validator=_optional_count)
    max_cost: float | None = attrs.field(default=None, validator=_optional_cost)
    max_duration: timedelta | None = attrs.field(default=None, validator=_optional_duration)
    max_attempts: int = attrs.field(
        default=5, validator=lambda _i, _a, v: check_count(f"{type(_i).__name__}.max_attempts", v)
    )

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
    return check_names("capabilities", "capability", names)


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


def check_enqueue_flow(
    *,
    dedup_key: object,
    dedup_window: object,
    singleton: object,
    replace: object,
    debounce: object,
    debounce_key: object,
    debounce_max: object,
    concurrency_key: object,
) -> None:
    """The flow options of an enqueue, checked where they enter (``WorkflowTask.new``)."""
    if concurrency_key is not None:
        check_name("concurrency_key", concurrency_key)
    if dedup_key is not None:
        check_name("dedup_key", dedup_key)
    if dedup_window is not None:
        check_positive_timedelta("dedup_window", dedup_window)
    for name, flag in (("singleton", singleton), ("replace", replace)):
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{name} must be True or False, got {flag!r}")
    if (dedup_window is not None or singleton) and dedup_key is None:
        raise InvalidArgument("dedup_window and singleton=True need a dedup_key, got dedup_key=None")
    if dedup_window is not None and singleton:
        raise InvalidArgument("dedup_window and singleton=True are two ways to dedup; give one of them")
    if replace and not singleton:
        raise InvalidArgument("replace=True replaces a singleton's existing task; it needs singleton=True")
    if debounce is not None:
        check_positive_timedelta("debounce", debounce)
        if debounce_key is None:
            raise InvalidArgument("debounce needs a debounce_key, got debounce_key=None")
        check_name("debounce_key", debounce_key)
        if dedup_key is not None:
            raise InvalidArgument(
                "debounce and dedup_key are two ways to collapse enqueues; give one of them"
            )
    elif debounce_key is not None or debounce_max is not None:
        raise InvalidArgument("debounce_key and debounce_max need debounce, got debounce=None")
    if debounce_max is not None:
        most = check_positive_timedelta("debounce_max", debounce_max)
        assert isinstance(debounce, timedelta)
        if most < debounce:
            raise InvalidArgument(f"debounce_max must be at least debounce ({debounce}), got {debounce_max}")


@attrs.frozen
class EnqueueFlow:
    """What an enqueue does when other tasks share its key: a task with the same
    ``dedup_key`` created within ``dedup_window`` is returned instead of a new one; with
    ``singleton`` an unfinished task of the key is returned (or, with ``replace``, cancelled
    and the new one enqueued); with ``debounce`` the queued task of ``debounce_key`` takes
    this input and waits ``debounce`` more (at most ``debounce_max`` after the first)."""

    dedup_key: str | None = None
    dedup_window: timedelta | None = None
    singleton: bool = False
    replace: bool = False
    debounce: timedelta | None = None
    debounce_key: str | None = None
    debounce_max: timedelta | None = None

    @property
    def any(self) -> bool:
        return self.dedup_key is not None or self.debounce is not None


@attrs.frozen
class WorkflowTask:
    """A request to run one definition version on one input, identified by its
    checkpoint identity (``task_id``). :meth:`new` checks the arguments but not that a
    definition of that name and version exists or that the input fits it:
    ``WorkflowRegistry.task`` checks both."""

    task_id: str
    definition_name: str
    definition_version: int
    input_json: str
    tenant: str
    priority: int
    not_before: datetime | None
    # The task that started this one as its child (``ctx.start_child``), else None.
    parent_id: str | None = None
    # The named queue it goes on: only workers claiming from that queue take it.
    queue: str = "default"
    # A child (parent_id set) that cancelling its parent does not cancel
    # (``ctx.start_child(..., detached=True)``).
    detached: bool = False
    # What the registry that checked the task knows of its definition (set by
    # ``WorkflowRegistry.task``); the store records it with the task. Not part of what
    # the task is: enqueue's idempotency compares the fields above.
    declared: DeclaredSignals | None = attrs.field(default=None, eq=False, repr=False)
    # The group its concurrency and rate limits count it in (``model.flow``), else None.
    concurrency_key: str | None = None
    # What the enqueue does when tasks share its dedup or debounce key (``model.flow``):
    # how it is enqueued, not what it is.
    flow: EnqueueFlow | None = attrs.field(default=None, eq=False)

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
        check_task_fields(name, version, tenant, priority, not_before, queue)
        task_id = uuid.uuid4().hex if checkpoint_id is None else check_name("checkpoint id", checkpoint_id)
        check_enqueue_flow(
            dedup_key=dedup_key,
            dedup_window=dedup_window,
            singleton=singleton,
            replace=replace,
            debounce=debounce,
            debounce_key=debounce_key,
            debounce_max=debounce_max,
            concurrency_key=concurrency_key,
        )
        flow = EnqueueFlow(dedup_key, dedup_window, singleton, replace, debounce, debounce_key, debounce_max)
        return cls(
            task_id,
            name,
            version,
            input_text(input),
            tenant,
            priority,
            not_before,
            queue=queue,
            concurrency_key=concurrency_key,
            flow=flow if flow.any else None,
        )

    def check(self) -> WorkflowTask:
        """Each field checked as :meth:`new` checks its arguments, raising
        :class:`InvalidArgument` naming the first bad one (``input_json`` is the store's to
        check: it is text, which :func:`input_text` makes). The store checks every task it
        is given: one built directly or changed with ``attrs.evolve`` would otherwise
        reach the database unchecked, and fail later inside a worker."""
        check_task_fields(
            self.definition_name,
            self.definition_version,
            self.tenant,
            self.priority,
            self.not_before,
            self.queue,
        )
        check_name("task id", self.task_id)
        if self.parent_id is not None:
            check_name("parent id", self.parent_id)
        if not isinstance(self.detached, bool):
            raise InvalidArgument(f"detached must be True or False, got {bounded(self.detached)}")
        if self.detached and self.parent_id is None:
            raise InvalidArgument(f"task {self.task_id!r} is detached with no parent: only a child detaches")
        if self.declared is not None and not isinstance(self.declared, DeclaredSignals):
            raise InvalidArgument(f"declared must be None or DeclaredSignals, got {bounded(self.declared)}")
        if self.concurrency_key is not None:
            check_name("concurrency_key", self.concurrency_key)
        if self.flow is not None:
            if not isinstance(self.flow, EnqueueFlow):
                raise InvalidArgument(f"flow must be None or EnqueueFlow, got {bounded(self.flow)}")
            check_enqueue_flow(concurrency_key=self.concurrency_key, **attrs.asdict(self.flow))
        return self


def check_task_fields(
    name: object, version: object, tenant: object, priority: object, not_before: object, queue: object
) -> None:
    """The fields of a task that :meth:`WorkflowTask.new` takes as they are, checked
    once for it and for the store (:meth:`WorkflowTask.check`)."""
    check_name("workflow name", name)
    check_name("queue", queue)
    check_version(version)
    check_name("tenant", tenant)
    check_stored_int("priority", priority)
    if not_before is not None:
        check_moment("not_before", not_before)


def input_text(input: Any) -> str:
    """The canonical JSON text of a workflow input, refused (naming the input) when it is
    not JSON, nests past :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH` or is over
    :data:`MAX_INPUT_BYTES` encoded: what a worker could not decode or a store keep."""
    try:
        input_json = to_json(input, max_depth=MAX_NESTING_DEPTH)
    except NestedTooDeep as exc:
        raise InvalidArgument(f"workflow input {exc}") from exc
    except NotJsonable as exc:
        raise InvalidArgument(f"workflow input {bounded(input)} is not JSON-serializable: {exc}") from exc
    if len(input_json.encode()) > MAX_INPUT_BYTES:
        raise InvalidArgument(
            f"workflow input is {len(input_json.encode())} bytes encoded, over the "
            f"limit of {MAX_INPUT_BYTES}; store large data outside and pass its id"
        )
    return input_json
