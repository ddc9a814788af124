"""``WorkerSettings``: how one worker claims, keeps and runs its tasks, checked once.

Every setting has its default and its check here, on the field, so a worker built with
keywords, with a settings object, or from an application's ``RUNIFOLD_*`` settings is
refused the same way: :class:`InvalidArgument` naming the setting and the value, at the
call that received it rather than later inside a worker. Each field's check is a
function of a name and a value, kept in the field's metadata (``check``) so that a
reader of ``RUNIFOLD_*`` settings names the setting as it was given
(``runifold_sync.settings``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

import attrs

from ..errors import InvalidArgument
from ..model import validate
from ..model.checkpoint import DEFAULT_MAX_ENTRY_BYTES
from ..model.values import LeaseDuration

MAX_CLAIM_BATCH = 100
MIN_ENTRY_BYTES = 1024
# ``claim_batch="auto"`` (the default): each claim's size adapts, up to this many tasks.
AUTO: Literal["auto"] = "auto"
AUTO_CLAIM_BATCH = 10


def seconds(value: timedelta) -> str:
    return f"{value.total_seconds():g} s"


def _queues(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, tuple):
        validate.refuse(name, "a tuple of queue names", value)
    if not value:
        raise InvalidArgument(f"{name} must name at least one queue")
    return tuple(validate.name("queue", queue) for queue in value)


def claim_batch(name: str, value: object) -> int | Literal["auto"]:
    """``"auto"`` or a fixed number of tasks a claim asks for, 1..``MAX_CLAIM_BATCH``."""
    if value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CLAIM_BATCH:
        return value
    validate.refuse(name, f"'auto' or an integer in 1..{MAX_CLAIM_BATCH}", value)


def _queue_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def default_heartbeat(lease: object) -> timedelta:
    """A third of the lease, so a lease given alone is never refused for its heartbeat."""
    if not isinstance(lease, LeaseDuration):
        return timedelta(seconds=10)  # the lease is refused by its own check
    return lease.value / 3


@attrs.frozen
class WorkerSettings:
    """What a :class:`~runifold_sync.WorkflowWorker` is configured with.

    ``lease_duration`` is how long a claim holds a task without a heartbeat, which comes
    every ``heartbeat_interval`` (at most half the lease; default a third of it).
    ``claim_batch`` tasks are claimed at once and run in turn, their leases kept alive
    meanwhile; ``"auto"`` (the default) sizes each claim from 1 to ``AUTO_CLAIM_BATCH``
    by the queue's depth and how long this worker's tasks take
    (:class:`~runifold_sync.worker.batch.ClaimSize`). A claim runs at most
    ``max_steps_per_claim`` steps (None: no limit) before the task is requeued.
    ``max_entry_bytes`` bounds each journal entry, the checkpoint head and the result. A
    task whose definition version this worker lacks is requeued after
    ``unavailable_delay`` (a safety net: claims take only what the worker serves).
    ``queues`` are the named queues it claims from."""

    lease_duration: LeaseDuration = validate.field(
        validate.is_a(LeaseDuration), LeaseDuration(timedelta(seconds=30))
    )
    heartbeat_interval: timedelta = validate.field(
        validate.positive_duration,
        attrs.Factory(lambda s: default_heartbeat(s.lease_duration), takes_self=True),
    )
    claim_batch: int | Literal["auto"] = validate.field(claim_batch, AUTO)
    max_steps_per_claim: int | None = validate.field(validate.optional(validate.count), None)
    max_entry_bytes: int = validate.field(
        validate.bounded_by(validate.integer, minimum=MIN_ENTRY_BYTES), DEFAULT_MAX_ENTRY_BYTES
    )
    unavailable_delay: timedelta = validate.field(validate.duration, timedelta(seconds=5))
    queues: tuple[str, ...] = validate.field(_queues, ("default",), converter=_queue_tuple)

    def __attrs_post_init__(self) -> None:
        """A heartbeat clearly shorter than the lease: one missed beat must not lose it."""
        lease = self.lease_duration.value
        if self.heartbeat_interval * 2 > lease:
            raise InvalidArgument(
                f"heartbeat_interval {seconds(self.heartbeat_interval)} must be at most half the "
                f"lease_duration {seconds(lease)}, so one missed beat does not lose the lease"
            )

    @property
    def adaptive_claims(self) -> bool:
        """Whether each claim's size adapts (``claim_batch="auto"``)."""
        return self.claim_batch == AUTO

    @property
    def max_claim(self) -> int:
        """The most tasks one claim asks for."""
        return self.claim_batch if isinstance(self.claim_batch, int) else AUTO_CLAIM_BATCH

    def replace(self, **changes: Any) -> WorkerSettings:
        """A copy with ``changes`` (field names; :class:`InvalidArgument` for another
        name). A heartbeat left at its default, a third of the lease, follows a lease
        changed without one."""
        unknown = sorted(set(changes) - set(attrs.fields_dict(WorkerSettings)))
        if unknown:
            raise InvalidArgument(
                f"{', '.join(unknown)}: not a worker setting; the worker settings are "
                f"{', '.join(attrs.fields_dict(WorkerSettings))}"
            )
        defaulted = self.heartbeat_interval == default_heartbeat(self.lease_duration)
        if "lease_duration" in changes and "heartbeat_interval" not in changes and defaulted:
            changes["heartbeat_interval"] = default_heartbeat(changes["lease_duration"])
        return attrs.evolve(self, **changes)
