"""Tenant admission: which tenants' ready tasks a claim may take right now.

A tenant may cap its concurrently leased tasks (``max_leased``) and what its tasks charge
through ``ctx.charge`` within a sliding window (a :class:`TenantBudget`). Claims skip a
tenant at its lease limit or over its budget; its tasks stay queued (deferred, never
failed) and say why in ``show`` and ``list``. Policies live in the store, so every worker
on every host enforces the same ones.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from . import validate
from .values import TaskState

INT32_MAX = 2**31 - 1  # PostgreSQL keeps max_leased as INTEGER


@attrs.frozen
class TenantBudget:
    """At most ``cost`` units charged by a tenant's tasks within any ``window``."""

    cost: float = validate.field(validate.cost, prefix=True)
    window: timedelta = validate.field(validate.positive_duration, prefix=True)


@attrs.frozen
class TenantPolicy:
    """A tenant's admission limits; None means unlimited. ``max_leased=0`` pauses it."""

    tenant: str = validate.field(validate.name)
    max_leased: int | None = validate.field(
        validate.optional(validate.bounded_by(validate.integer, minimum=0, maximum=INT32_MAX)),
        None,
        prefix=True,
    )
    budget: TenantBudget | None = validate.field(
        validate.optional(validate.is_a(TenantBudget)), None, prefix=True
    )


@attrs.frozen
class TenantAdmission:
    """Where a tenant with a policy stands at store time ``at``: its unexpired leases,
    what it charged within its budget window, and how many of its tasks are ready."""

    policy: TenantPolicy
    at: datetime
    leased: int
    spent: float
    ready: int
    oldest_charge_at: datetime | None  # the next charge to leave the window

    @property
    def at_limit(self) -> bool:
        limit = self.policy.max_leased
        return limit is not None and self.leased >= limit

    @property
    def over_budget(self) -> bool:
        budget = self.policy.budget
        return budget is not None and self.spent >= budget.cost

    @property
    def held(self) -> int:
        """Ready tasks a claim would skip now."""
        return self.ready if self.at_limit or self.over_budget else 0

    def hold_reason(self) -> str | None:
        """Why this tenant's ready tasks are not being claimed, or None if they are."""
        tenant = self.policy.tenant
        budget = self.policy.budget
        if budget is not None and self.over_budget:
            frees = ""
            if self.oldest_charge_at is not None:
                leaves = self.oldest_charge_at + budget.window
                frees = f"; its oldest charge leaves the window at {leaves.isoformat()}"
            return (
                f"deferred by budget admission: tenant {tenant!r} charged {self.spent:g} of "
                f"{budget.cost:g} cost units in the last {budget.window}{frees}"
            )
        if self.at_limit:
            return (
                f"queued behind tenant limit: tenant {tenant!r} has {self.leased} of "
                f"{self.policy.max_leased} allowed tasks leased"
            )
        return None


def explain(
    state: TaskState, ready_at: datetime | None, tenant: str, admissions: dict[str, TenantAdmission]
) -> str | None:
    """The admission reason a ready, unleased task of ``tenant`` is not running, if any."""
    admission = admissions.get(tenant)
    if admission is None or state not in (TaskState.QUEUED, TaskState.WAITING):
        return None
    if ready_at is None or ready_at > admission.at:
        return None
    return admission.hold_reason()
