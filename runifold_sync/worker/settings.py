"""``WorkerSettings``: how one worker claims, keeps and runs its tasks, checked once.

Every setting has its default and its check here, on the field, so a worker built with
keywords, with a settings object, or from an application's ``RUNIFOLD_*`` settings is
refused the same way: :class:`InvalidArgument` naming the field and the value, at the
call that received it rather than later inside a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypedDict

import attrs

from ..errors import InvalidArgument
from ..model.checkpoint import DEFAULT_MAX_ENTRY_BYTES
from ..model.values import LeaseDuration, check_int, check_name

MAX_CLAIM_BATCH = 100
MIN_ENTRY_BYTES = 1024

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _integer(minimum: int, maximum: int | None = None, *, optional: bool = False) -> _Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None or not optional:
            check_int(attribute.name, value, minimum=minimum, maximum=maximum)

    return check


def _check_lease(_inst: Any, _attr: Any, value: object) -> None:
    if not isinstance(value, LeaseDuration):
        raise InvalidArgument(f"lease_duration must be a LeaseDuration, got {value!r}")


def _check_heartbeat(inst: WorkerSettings, _attr: Any, value: object) -> None:
    """A heartbeat clearly shorter than the lease: one missed beat must not lose it."""
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise InvalidArgument(f"heartbeat interval must be a positive timedelta, got {value!r}")
    lease = inst.lease_duration.value
    if value * 2 > lease:
        raise InvalidArgument(
            f"heartbeat interval {value} must be at most half the lease duration {lease}, "
            "so one missed beat does not lose the lease"
        )


def _check_queues(_inst: Any, _attr: Any, value: object) -> None:
    if isinstance(value, str) or not isinstance(value, tuple):
        raise InvalidArgument(f"queues must be a tuple of queue names, got {value!r}")
    if not value:
        raise InvalidArgument("queues must name at least one queue")
    for queue in value:
        check_name("queue", queue)


def _queue_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def _check_unavailable_delay(_inst: Any, _attr: Any, value: object) -> None:
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise InvalidArgument(f"unavailable_delay must be a non-negative timedelta, got {value!r}")


@attrs.frozen
class WorkerSettings:
    """What a :class:`~runifold_sync.WorkflowWorker` is configured with.

    ``lease_duration`` is how long a claim holds a task without a heartbeat, which comes
    every ``heartbeat_interval`` (at most half the lease). ``claim_batch`` tasks are
    claimed at once and run in turn, their leases kept alive meanwhile. A claim runs at
    most ``max_steps_per_claim`` steps (None: no limit) before the task is requeued.
    ``max_entry_bytes`` bounds each journal entry, the checkpoint head and the result. A task whose definition
    version this worker lacks is requeued after ``unavailable_delay`` (a safety net:
    claims take only what the worker serves). ``queues`` are the named queues it claims
    from."""

    lease_duration: LeaseDuration = attrs.field(
        default=LeaseDuration(timedelta(seconds=30)), validator=_check_lease
    )
    heartbeat_interval: timedelta = attrs.field(default=timedelta(seconds=10), validator=_check_heartbeat)
    claim_batch: int = attrs.field(default=1, validator=_integer(1, MAX_CLAIM_BATCH))
    max_steps_per_claim: int | None = attrs.field(default=None, validator=_integer(1, optional=True))
    max_entry_bytes: int = attrs.field(default=DEFAULT_MAX_ENTRY_BYTES, validator=_integer(MIN_ENTRY_BYTES))
    unavailable_delay: timedelta = attrs.field(
        default=timedelta(seconds=5), validator=_check_unavailable_delay
    )
    queues: tuple[str, ...] = attrs.field(
        default=("default",),
        converter=_queue_tuple,
        validator=_check_queues,
    )


class WorkerOptions(TypedDict, total=False):
    """The settings a :class:`~runifold_sync.WorkflowWorker` also takes as keywords."""

    max_steps_per_claim: int | None
    max_entry_bytes: int
    unavailable_delay: timedelta
    claim_batch: int
    queues: tuple[str, ...]
