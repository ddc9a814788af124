"""The two pictures the dashboard draws on the server, as geometry its templates turn
into SVG (every label escaped there like any other text): the throughput of the last
hour as bars, and a task's life as a timeline of the periods it spent queued, running
and waiting, with a mark for each event of its history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import attrs

from ..store.records import FinishedInterval, TaskEvent

CHART_WIDTH = 600
CHART_HEIGHT = 120
TIMELINE_WIDTH = 800
TIMELINE_HEIGHT = 60

# What a history event starts: the period after it, until the next event that starts
# one. Events not listed (a signal received, a cancel requested) are marks only.
_STARTS = {
    "enqueued": "queued",
    "claimed": "running",
    "suspended": "waiting",
    "released": "queued",
    "handed_back": "queued",  # the worker died: claimable again at once
    "retried": "queued",
    "requeued": "queued",
    "effect_resolved": "queued",
    "resumed": "queued",
    "continued": "queued",
    "completed": None,
    "failed": None,
    "cancelled": None,
}


@attrs.frozen
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str  # the interval and its counts, shown as the bar's title


@attrs.frozen
class Throughput:
    bars: list[Bar]
    peak: int
    total: int
    start: datetime | None  # where the first interval starts
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def throughput(intervals: Sequence[FinishedInterval]) -> Throughput:
    """Bars of ``intervals`` (oldest first), each as tall as its share of the busiest."""
    peak = max((i.total for i in intervals), default=0)
    slot = CHART_WIDTH / max(len(intervals), 1)
    bars = []
    for n, interval in enumerate(intervals):
        height = 0.0 if peak == 0 else (CHART_HEIGHT - 20) * interval.total / peak
        label = (
            f"{interval.start:%H:%M} UTC: {interval.completed} completed, "
            f"{interval.failed} failed, {interval.cancelled} cancelled"
        )
        bars.append(Bar(n * slot + 2, CHART_HEIGHT - height, slot - 4, height, label))
    start = intervals[0].start if intervals else None
    return Throughput(bars, peak, sum(i.total for i in intervals), start)


@attrs.frozen
class Period:
    kind: str  # queued, running or waiting: its CSS class
    x: float
    width: float
    label: str


@attrs.frozen
class Mark:
    x: float
    kind: str
    label: str


@attrs.frozen
class Timeline:
    periods: list[Period]
    marks: list[Mark]
    start: datetime
    end: datetime
    width: int = TIMELINE_WIDTH
    height: int = TIMELINE_HEIGHT


def timeline(history: Sequence[TaskEvent], now: datetime, finished: bool) -> Timeline | None:
    """The task's periods from its history (None when it has none): from its first
    event to its last if it is finished, else to ``now``."""
    if not history:
        return None
    start = history[0].at
    end = history[-1].at if finished else max(now, history[-1].at)
    span_s = max((end - start).total_seconds(), 1e-3)

    def x(at: datetime) -> float:
        return round(TIMELINE_WIDTH * (at - start).total_seconds() / span_s, 2)

    periods: list[Period] = []
    open_kind: str | None = None
    opened = start
    for event in history:
        if event.kind not in _STARTS:
            continue
        if open_kind is not None:
            periods.append(_period(open_kind, opened, event.at, x))
        open_kind, opened = _STARTS[event.kind], event.at
    if open_kind is not None:
        periods.append(_period(open_kind, opened, end, x))
    marks = [Mark(x(e.at), e.kind, f"{e.at.isoformat()} {e.kind}") for e in history]
    return Timeline(periods, marks, start, end)


def _period(kind: str, began: datetime, ended: datetime, x: Callable[[datetime], float]) -> Period:
    left, right = x(began), x(ended)
    took = ended - began
    label = f"{kind} {_duration(took)} from {began.isoformat()}"
    return Period(kind, left, max(right - left, 1.0), label)


def _duration(took: timedelta) -> str:
    seconds = took.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
