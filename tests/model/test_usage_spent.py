"""``BudgetUsage.spent`` and ``claimed``: the engine's own counting, as ``add`` counts it."""

from __future__ import annotations

import sys

import pytest

from runifold_sync.errors import InvalidArgument
from runifold_sync.model.values import BudgetUsage


def test_spent_counts_what_add_counts() -> None:
    usage = BudgetUsage(steps=2, cost=1.5, elapsed_s=3.0, claims=1)
    assert usage.spent(1, 0.25, 0.5) == usage.add(steps=1, cost=0.25, elapsed_s=0.5)
    assert usage.spent(0, 0.0, 0.0) == usage


def test_spent_refuses_a_total_cost_past_the_largest_float() -> None:
    usage = BudgetUsage(cost=sys.float_info.max)
    with pytest.raises(InvalidArgument, match="past the largest float"):
        usage.spent(1, sys.float_info.max, 0.0)


def test_claimed_counts_one_claim() -> None:
    usage = BudgetUsage(steps=2, cost=1.5, elapsed_s=3.0, claims=1)
    assert usage.claimed() == usage.add(claims=1)
