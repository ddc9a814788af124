"""Flow control by key: the limits a claim applies (concurrency and rate, per key, per
definition or per queue), what an enqueue does with a dedup key, a singleton or a
debounce, and where each limited group stands.

A *group* is what a limit counts: for a ``key`` limit, the tasks of one concurrency key
(a limit whose target ends in ``*`` gives every key with that prefix a group of its own);
for a ``definition`` or ``queue`` limit, every task of that definition name or queue.
The store enforces the limits in its claim statement, so they hold across every worker
process and host (``store/sql_flow.py``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from ..errors import InvalidArgument
from . import validate
from .admission import INT32_MAX
from .values import EnqueueFlow

__all__ = ["SCOPES", "EnqueueFlow", "FlowGroup", "FlowLimit", "Rate", "limit_scope"]

SCOPES = ("key", "definition", "queue")


def limit_scope(field: str, value: object) -> str:
    """What a flow limit counts: one of :data:`SCOPES`."""
    if not isinstance(value, str) or value not in SCOPES:
        validate.refuse(field, f"one of {', '.join(SCOPES)}", value)
    return value


@attrs.frozen
class Rate:
    """At most ``count`` claims within any ``period``, counted in store time."""

    count: int = validate.field(
        validate.bounded_by(validate.integer, minimum=1, maximum=INT32_MAX), prefix=True
    )
    period: timedelta = validate.field(validate.positive_duration, prefix=True)

    def __str__(self) -> str:
        return f"{self.count} per {self.period.total_seconds():g}s"


@attrs.frozen
class FlowLimit:
    """A limit on the tasks of ``scope`` ``target``: ``max_running`` leased at once and
    ``rate`` claims per period, either or both (``max_running=0`` holds the group). When
    several ``key`` limits match a key, the one naming it exactly wins, else the longest
    prefix pattern."""

    scope: str = validate.field(limit_scope, prefix=True)
    target: str = validate.field(validate.name, prefix=True)
    max_running: int | None = validate.field(
        validate.optional(validate.bounded_by(validate.integer, minimum=0, maximum=INT32_MAX)),
        None,
        prefix=True,
    )
    rate: Rate | None = validate.field(validate.optional(validate.is_a(Rate)), None, prefix=True)

    def __attrs_post_init__(self) -> None:
        if self.max_running is None and self.rate is None:
            raise InvalidArgument(
                f"FlowLimit for {self.scope} {self.target!r} needs max_running or rate (or both), got neither"
            )

    def matches(self, key: str) -> bool:
        """Whether this ``key`` limit applies to concurrency key ``key``."""
        if self.target.endswith("*"):
            return key.startswith(self.target[:-1]) or key == self.target
        return key == self.target

    def describe(self) -> str:
        parts = []
        if self.max_running is not None:
            parts.append(f"max_running {self.max_running}")
        if self.rate is not None:
            parts.append(f"rate {self.rate}")
        return f"{self.scope} {self.target!r} ({', '.join(parts)})"


@attrs.frozen
class FlowGroup:
    """Where one limited group stands at store time ``at``: its unexpired leases, its
    claims within the rate's window, its ready tasks (due and waiting for a claim), and
    when the oldest claim in the window leaves it (when a rate-limited group may run)."""

    limit: FlowLimit
    name: str
    at: datetime
    running: int
    claimed_in_window: int
    waiting: int
    oldest_claim_at: datetime | None

    @property
    def at_max_running(self) -> bool:
        limit = self.limit.max_running
        return limit is not None and self.running >= limit

    @property
    def out_of_rate(self) -> bool:
        rate = self.limit.rate
        return rate is not None and self.claimed_in_window >= rate.count

    @property
    def next_claim_at(self) -> datetime | None:
        """When the rate lets the next claim through (None: now, or no rate)."""
        rate = self.limit.rate
        if rate is None or not self.out_of_rate or self.oldest_claim_at is None:
            return None
        return self.oldest_claim_at + rate.period

    def hold_reason(self) -> str | None:
        """Why this group's ready tasks are not being claimed, or None if they may be."""
        group = f"{self.limit.scope} {self.name!r}"
        if self.at_max_running:
            return (
                f"held by the concurrency limit of {group}: "
                f"{self.running} running of max_running {self.limit.max_running}"
            )
        if self.out_of_rate:
            assert self.limit.rate is not None
            when = self.next_claim_at
            until = "" if when is None else f"; may run at {when.isoformat()}"
            return (
                f"held by the rate limit of {group}: {self.claimed_in_window} claims in the last "
                f"{self.limit.rate.period.total_seconds():g}s of {self.limit.rate.count} allowed{until}"
            )
        return None
