"""``ClaimSize``: how many tasks a worker's next claim asks for. Fixed, the number given;
adaptive (``claim_batch="auto"``), one task until claims come back full and the tasks
are short, then doubling up to the maximum and the hold budget, and one again as soon
as a claim comes back short or a task runs long."""

from __future__ import annotations

import time

import pytest

from runifold_sync.worker.batch import HOLD_BUDGET_S, ClaimSize
from runifold_sync.worker.settings import AUTO_CLAIM_BATCH, WorkerSettings

SHORT_S = 0.001  # a one-step task
LONG_S = 2 * HOLD_BUDGET_S


def _auto(maximum: int = AUTO_CLAIM_BATCH, lease_s: float = 30.0) -> ClaimSize:
    return ClaimSize(maximum, adaptive=True, lease_s=lease_s)


def _deep(size: ClaimSize, claims: int, task_s: float = SHORT_S) -> list[int]:
    """The limits of ``claims`` claims that each come back full, each task taking ``task_s``."""
    limits = []
    for _ in range(claims):
        limit = size.limit
        limits.append(limit)
        size.claimed(limit, limit)
        for _ in range(limit):
            size.ran(task_s)
    return limits


def test_a_fixed_claim_batch_asks_for_its_number_whatever_happens() -> None:
    size = ClaimSize(4, adaptive=False, lease_s=30.0)
    size.claimed(4, 0)
    size.ran(60.0)
    size.claimed(4, 4)
    assert (size.limit, size.largest, size.task_s) == (4, 4, None)


def test_auto_starts_at_one_task_and_stays_there_until_a_task_has_run() -> None:
    size = _auto()
    assert size.limit == 1
    size.claimed(1, 1)  # full, but nothing is known of how long the tasks take
    assert size.limit == 1


def test_auto_doubles_while_claims_come_back_full_of_short_tasks_up_to_the_maximum() -> None:
    assert _deep(_auto(), 7) == [1, 1, 2, 4, 8, 10, 10]  # the first claim knows no duration
    assert _deep(_auto(maximum=3), 4) == [1, 1, 2, 3]


def test_auto_drops_to_one_task_when_a_claim_comes_back_short() -> None:
    size = _auto()
    _deep(size, 5)
    assert size.limit == AUTO_CLAIM_BATCH
    size.claimed(AUTO_CLAIM_BATCH, 3)  # the queue is shallow now: others may be idle
    assert size.limit == 1
    _deep(size, 1)
    assert size.limit == 2  # and grows again from one while the queue is deep
    size.claimed(2, 0)  # an empty queue
    assert size.limit == 1
    assert size.largest == AUTO_CLAIM_BATCH


def test_auto_drops_to_one_task_when_a_task_outlasts_the_hold_budget() -> None:
    size = _auto()
    _deep(size, 5)
    size.ran(LONG_S)
    assert size.limit == 1
    size.claimed(1, 1)
    assert size.limit == 1  # the average is still too long for two in the budget


def test_auto_never_grows_for_long_tasks_however_deep_the_queue() -> None:
    size = _auto()
    assert _deep(size, 6, task_s=LONG_S) == [1] * 6
    assert size.largest == 1


@pytest.mark.parametrize(("task_s", "most"), [(HOLD_BUDGET_S / 2, 2), (HOLD_BUDGET_S / 4, 4)])
def test_auto_claims_only_as_many_as_fit_in_the_hold_budget(task_s: float, most: int) -> None:
    size = _auto()
    assert max(_deep(size, 8, task_s=task_s)) == most
    assert size.limit * size.task_s <= HOLD_BUDGET_S + 1e-9  # type: ignore[operator]


def test_the_hold_budget_is_at_most_a_twentieth_of_the_lease() -> None:
    """With a 1 s lease a batch may hold 50 ms of tasks: 5 of 10 ms, not 10."""
    size = _auto(lease_s=1.0)
    assert max(_deep(size, 8, task_s=0.01)) == 5


def test_a_batch_shrinks_as_its_tasks_grow_longer() -> None:
    size = _auto()
    _deep(size, 5)
    assert size.limit == AUTO_CLAIM_BATCH
    for _ in range(10):
        size.ran(HOLD_BUDGET_S / 3)
    assert 1 <= size.limit <= 3


def test_the_default_worker_settings_size_claims_automatically_up_to_10() -> None:
    settings = WorkerSettings()
    assert (settings.claim_batch, settings.adaptive_claims, settings.max_claim) == ("auto", True, 10)
    fixed = settings.replace(claim_batch=1)
    assert (fixed.adaptive_claims, fixed.max_claim) == (False, 1)


def test_a_completion_claims_one_task_when_its_own_task_outlasted_the_budget() -> None:
    """The claim made in a completion's transaction comes before the task's duration is
    counted: it looks at how long the running task has run so far."""
    size = _auto()
    _deep(size, 5)
    size.begin(time.monotonic())
    assert size.ending() == AUTO_CLAIM_BATCH
    size.begin(time.monotonic() - LONG_S)
    assert size.ending() == 1
    assert size.limit == 1
