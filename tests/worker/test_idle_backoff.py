"""``IdleBackoff``: the delays an idle pool worker sleeps between empty claims."""

from __future__ import annotations

import statistics
from datetime import timedelta

from runifold_sync.worker.idle_backoff import IdleBackoff

MIN_S, MAX_S = 0.025, 5.0


def _backoff() -> IdleBackoff:
    return IdleBackoff(timedelta(seconds=MIN_S), timedelta(seconds=MAX_S))


def test_every_delay_stays_within_min_and_max() -> None:
    backoff = _backoff()
    delays = [backoff.next_s() for _ in range(2000)]
    assert all(MIN_S <= d <= MAX_S for d in delays)


def test_first_delays_of_workers_going_idle_together_differ() -> None:
    firsts = [_backoff().next_s() for _ in range(50)]
    assert all(MIN_S <= d <= 2 * MIN_S for d in firsts)
    assert len(set(firsts)) == 50
    later = [_backoff() for _ in range(50)]
    tenth = [[b.next_s() for _ in range(10)][-1] for b in later]
    assert len(set(tenth)) == 50


def test_delays_grow_towards_max_and_then_stay_in_its_upper_half() -> None:
    runs = [[b.next_s() for _ in range(12)] for b in (_backoff() for _ in range(200))]
    means = [statistics.mean(run[k] for run in runs) for k in range(12)]
    assert means[:8] == sorted(means[:8])  # 25 ms doubling reaches 5 s at the eighth wait
    assert means[7] > 20 * means[0]
    assert all(MAX_S / 2 <= run[k] <= MAX_S for run in runs for k in range(8, 12))


def test_reset_after_work_starts_again_from_the_first_step() -> None:
    backoff = _backoff()
    for _ in range(20):
        backoff.next_s()
    assert backoff.next_s() >= MAX_S / 2
    backoff.reset()
    assert MIN_S <= backoff.next_s() <= 2 * MIN_S


def test_equal_bounds_give_exactly_that_delay() -> None:
    backoff = IdleBackoff(timedelta(seconds=1), timedelta(seconds=1))
    assert {backoff.next_s() for _ in range(5)} == {1.0}
