"""Tick times with a fixed clock (no sleeping): cron in Europe/Berlin across both DST
changes of 2026, intervals counted from the epoch, and only the latest tick after
downtime, checked against a walk of every tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runifold_sync import Schedule
from runifold_sync.model.schedule_times import ScheduleTimes, format_seconds, tick_text

BERLIN = ZoneInfo("Europe/Berlin")
NIGHTLY = Schedule("nightly", "report", 1, cron="30 2 * * *", timezone="Europe/Berlin").times


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def created_by_a_pool_looking_every(
    times: ScheduleTimes, start: datetime, end: datetime, step: timedelta
) -> list[datetime]:
    """The ticks a pool creates that looks at ``step`` intervals from ``start`` to ``end``."""
    after, now, created = start, start, []
    while now <= end:
        due = times.latest_due(after, now)
        if due is not None:
            created.append(due)
            after = due
        now += step
    return created


@pytest.mark.parametrize("step", [timedelta(seconds=10), timedelta(minutes=1), timedelta(minutes=7)])
def test_cron_at_half_past_two_in_berlin_on_the_spring_forward_day_fires_once_at_three(
    step: timedelta,
) -> None:
    ticks = created_by_a_pool_looking_every(NIGHTLY, utc("2026-03-27T12:00"), utc("2026-03-31T12:00"), step)
    assert [t.astimezone(BERLIN).isoformat() for t in ticks] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night: when the clock jumps
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    assert [tick_text(t) for t in ticks] == [
        "2026-03-28T01:30:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-30T00:30:00Z",
        "2026-03-31T00:30:00Z",
    ]


@pytest.mark.parametrize("step", [timedelta(seconds=10), timedelta(minutes=1), timedelta(minutes=7)])
def test_cron_at_half_past_two_in_berlin_on_the_fall_back_day_fires_once_at_its_first_pass(
    step: timedelta,
) -> None:
    ticks = created_by_a_pool_looking_every(NIGHTLY, utc("2026-10-23T12:00"), utc("2026-10-27T12:00"), step)
    assert [t.astimezone(BERLIN).isoformat() for t in ticks] == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",  # 02:30 comes twice that night: once, the first time
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]


def test_a_pool_back_in_the_repeated_hour_still_creates_that_nights_tick() -> None:
    # Down from before the first 02:30 (CEST) to 02:15 of the second pass (CET): cronsim's
    # reverse walk from 02:15 finds yesterday's tick, the forward walk from the last tick
    # finds tonight's.
    second_pass = datetime(2026, 10, 25, 2, 15, tzinfo=BERLIN, fold=1)
    assert tick_text(second_pass) == "2026-10-25T01:15:00Z"
    assert NIGHTLY.latest_due(utc("2026-10-24T00:30"), second_pass.astimezone(UTC)) == utc("2026-10-25T00:30")
    assert NIGHTLY.latest_due(utc("2026-10-22T00:30"), second_pass.astimezone(UTC)) == utc("2026-10-25T00:30")
    assert NIGHTLY.latest_due(utc("2026-10-25T00:30"), second_pass.astimezone(UTC)) is None
    assert NIGHTLY.next_after(second_pass.astimezone(UTC)) == utc("2026-10-26T01:30")


def test_cron_with_a_wildcard_hour_fires_on_real_time_across_both_changes() -> None:
    hourly = Schedule("hourly", "report", 1, cron="0 * * * *", timezone="Europe/Berlin").times
    spring = created_by_a_pool_looking_every(
        hourly, utc("2026-03-28T23:00"), utc("2026-03-29T22:00"), timedelta(minutes=1)
    )
    fall = created_by_a_pool_looking_every(
        hourly, utc("2026-10-24T22:00"), utc("2026-10-25T23:00"), timedelta(minutes=1)
    )
    assert len(spring) == 23 and len(fall) == 25  # the local days' lengths, in hours
    assert {b - a for a, b in zip(spring, spring[1:], strict=False)} == {timedelta(hours=1)}
    assert {b - a for a, b in zip(fall, fall[1:], strict=False)} == {timedelta(hours=1)}


def test_every_counts_from_the_epoch_so_every_process_agrees_on_the_ticks() -> None:
    hourly = Schedule("h", "report", 1, every=timedelta(hours=1)).times
    assert hourly.next_after(utc("2026-12-02T03:17:05")) == utc("2026-12-02T04:00")
    assert hourly.next_after(utc("2026-12-02T04:00")) == utc("2026-12-02T05:00")  # strictly after
    assert hourly.latest_at_or_before(utc("2026-12-02T04:00")) == utc("2026-12-02T04:00")
    seven = Schedule("s", "report", 1, every=timedelta(seconds=7)).times
    assert (seven.next_after(utc("2026-12-02T00:00")) - datetime(1970, 1, 1, tzinfo=UTC)) % timedelta(
        seconds=7
    ) == timedelta(0)
    assert hourly.describe() == "every 1h" and seven.describe() == "every 7s"
    assert format_seconds(90061) == "1d1h1m1s"


def test_only_the_latest_missed_tick_is_due_after_downtime() -> None:
    every_minute = Schedule("m", "report", 1, every=timedelta(minutes=1)).times
    assert every_minute.latest_due(utc("2026-12-02T03:00"), utc("2026-12-02T09:30:30")) == utc(
        "2026-12-02T09:30"
    )
    assert every_minute.latest_due(utc("2026-12-02T09:30"), utc("2026-12-02T09:30:59")) is None
    assert NIGHTLY.latest_due(utc("2026-11-01T01:30"), utc("2026-12-02T12:00")) == utc("2026-12-02T01:30")


def _walked(times: ScheduleTimes, after: datetime, now: datetime) -> datetime | None:
    latest, tick = None, times.next_after(after)
    while tick <= now:
        latest, tick = tick, times.next_after(tick)
    return latest


EXPRESSIONS = ["30 2 * * *", "0 * * * *", "*/20 * * * *", "15 1-3 * * *", "0 2 * * SUN", "45 2 25 10 *"]
# The days before DST changes in Berlin, New York and Lord Howe (a 30-minute shift).
AROUND_DST = st.sampled_from(
    [
        utc(f"{day}T00:00")
        for day in ("2026-03-28", "2026-10-24", "2026-03-07", "2026-10-31", "2026-04-04", "2026-10-03")
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    expression=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "UTC", "Australia/Lord_Howe"]),
    base=AROUND_DST,
    after_s=st.integers(0, 3 * 86400),
    span_s=st.integers(0, 2 * 86400),
)
def test_the_latest_due_tick_is_the_last_one_a_walk_of_every_tick_finds(
    expression: str, zone: str, base: datetime, after_s: int, span_s: int
) -> None:
    times = Schedule("p", "report", 1, cron=expression, timezone=zone).times
    after = base + timedelta(seconds=after_s, microseconds=after_s % 7 * 1000)
    now = after + timedelta(seconds=span_s)
    assert times.latest_due(after, now) == _walked(times, after, now)
    assert times.next_after(after) > after
