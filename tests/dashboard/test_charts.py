"""The geometry of the dashboard's two pictures: throughput bars scaled to the busiest
interval, and a task's periods (queued, running, waiting) from its history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from runifold_sync.dashboard import charts
from runifold_sync.store.records import FinishedInterval, TaskEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def event(seconds: float, kind: str) -> TaskEvent:
    return TaskEvent(0, "t", T0 + timedelta(seconds=seconds), kind, None, None, {})


def test_bars_are_as_tall_as_their_share_of_the_busiest_interval() -> None:
    intervals = [FinishedInterval(T0, 2), FinishedInterval(T0 + timedelta(minutes=5), 4, 1, 3)]
    chart = charts.throughput(intervals)
    assert (chart.peak, chart.total, chart.start) == (8, 10, T0)
    assert [b.height for b in chart.bars] == [(charts.CHART_HEIGHT - 20) / 4, charts.CHART_HEIGHT - 20]
    assert all(b.y + b.height == charts.CHART_HEIGHT for b in chart.bars)
    assert chart.bars[1].label == "00:05 UTC: 4 completed, 1 failed, 3 cancelled"
    assert [b.height for b in charts.throughput([FinishedInterval(T0)]).bars] == [0.0]


def test_a_timeline_has_a_period_from_each_transition_to_the_next() -> None:
    history = [
        event(0, "enqueued"),
        event(10, "claimed"),
        event(20, "suspended"),
        event(25, "signal_received"),  # a mark, not a period
        event(60, "claimed"),
        event(80, "completed"),
    ]
    line = charts.timeline(history, T0 + timedelta(hours=1), finished=True)
    assert line is not None
    assert [(p.kind, p.x, p.width) for p in line.periods] == [
        ("queued", 0.0, 100.0),
        ("running", 100.0, 100.0),
        ("waiting", 200.0, 400.0),
        ("running", 600.0, 200.0),
    ]
    assert [m.kind for m in line.marks] == [e.kind for e in history]
    assert line.end == T0 + timedelta(seconds=80)


def test_an_unfinished_tasks_last_period_runs_to_now() -> None:
    now = T0 + timedelta(seconds=40)
    line = charts.timeline([event(0, "enqueued"), event(10, "claimed")], now, finished=False)
    assert line is not None and line.end == now
    assert [(p.kind, p.x, p.width) for p in line.periods] == [
        ("queued", 0.0, 200.0),
        ("running", 200.0, 600.0),
    ]
    assert charts.timeline([], now, finished=False) is None
