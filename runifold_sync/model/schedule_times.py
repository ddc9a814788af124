"""When a schedule's ticks fall: a cron expression in a timezone, or a fixed interval.

Every pool on every host must agree on a schedule's tick times without talking to the
others, since a tick's task id is made of its time. So tick times are a pure function of
the expression:

- ``cron``: a 5-field expression, read by cronsim in the schedule's timezone (the
  ``zoneinfo`` database). Across a DST change cronsim follows Debian cron: a time the
  clock skips (``30 2 * * *`` on the spring-forward day in Europe/Berlin) fires when the
  clock jumps, at 03:00; a time it passes twice (the fall-back day) fires once, at its
  first pass. Expressions whose minute or hour is a wildcard or a step (``*/15 * * *
  *``) fire on real time, so no tick is skipped or doubled either way.
- ``every``: whole seconds counted from 1970-01-01T00:00Z, so ``every=1h`` ticks on the
  hour and ``every=1s`` on each second, for every process alike.

All times here are aware UTC datetimes: cronsim yields local times, and Python compares
two times of one zone by their wall clock alone, which is wrong in a repeated hour.
"""

from __future__ import annotations

import abc
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..errors import InvalidArgument
from . import validate

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def tick_text(tick: datetime) -> str:
    """A tick in UTC ISO 8601 to the second (``2026-12-02T03:00:00Z``), as its task id
    and input carry it."""
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ScheduleTimes(abc.ABC):
    """The tick times of one expression."""

    @abc.abstractmethod
    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``."""

    @abc.abstractmethod
    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The last tick at or before ``moment`` (a hint: exact for ``every``, for cron
        possibly an earlier tick inside a repeated hour; see :meth:`latest_due`)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The expression as the CLI shows it (``cron 30 2 * * *``, ``every 1h``)."""

    def latest_due(self, after: datetime, now: datetime) -> datetime | None:
        """The latest tick in ``(after, now]``, or None when none is due: after downtime
        the ticks before it are skipped, not run one after the other."""
        first = self.next_after(after)
        if first > now:
            return None
        hint = self.latest_at_or_before(now)
        latest = first if hint is None or hint <= first or hint > now else hint
        following = self.next_after(latest)
        while following <= now:  # only where the hint fell short, in a repeated hour
            latest, following = following, self.next_after(following)
        return latest


class IntervalTimes(ScheduleTimes):
    """Multiples of ``seconds`` since the Unix epoch."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self._us = seconds * 1_000_000

    def _index(self, moment: datetime) -> int:
        delta = moment - EPOCH
        return (delta // timedelta(microseconds=1)) // self._us

    def _tick(self, index: int) -> datetime:
        return EPOCH + timedelta(microseconds=index * self._us)

    def next_after(self, moment: datetime) -> datetime:
        return self._tick(self._index(moment) + 1)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        return self._tick(self._index(moment))

    def describe(self) -> str:
        return f"every {format_seconds(self.seconds)}"


class CronTimes(ScheduleTimes):
    """A 5-field cron expression in ``zone``."""

    def __init__(self, expression: str, zone: ZoneInfo) -> None:
        self.expression = expression
        self.zone = zone

    def next_after(self, moment: datetime) -> datetime:
        # cronsim walks local wall-clock times; one at the repeated hour's first pass can
        # come out before ``moment`` when ``moment`` is in its second pass: walk on.
        walk = CronSim(self.expression, moment.astimezone(self.zone))
        while True:
            tick = next(walk).astimezone(UTC)
            if tick > moment:
                return tick

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        start = (moment.replace(microsecond=0) + _SECOND).astimezone(self.zone)
        try:
            return next(CronSim(self.expression, start, reverse=True)).astimezone(UTC)
        except StopIteration:
            return None

    def describe(self) -> str:
        return f"cron {self.expression}"


def format_seconds(seconds: int) -> str:
    """``3600`` as ``1h``, ``90`` as ``1m30s``: how ``every`` is shown."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"


def zone(name: object, schedule: str) -> ZoneInfo:
    """The timezone called ``name`` in the timezone database."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(
            f"schedule {schedule!r}: timezone must be a name such as 'Europe/Berlin', "
            f"got {validate.shown(name)}"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidArgument(
            f"schedule {schedule!r}: timezone {name!r} is not in the timezone database ({exc})"
        ) from None


def cron_times(expression: object, timezone: str, schedule: str) -> CronTimes:
    """``expression`` checked: five fields cronsim reads, that fire at least once."""
    if not isinstance(expression, str):
        validate.refuse(f"schedule {schedule!r}: cron", "a string", expression)
    fields = expression.split()
    if len(fields) != 5:
        raise InvalidArgument(
            f"schedule {schedule!r}: cron {expression!r} has {len(fields)} fields; it needs 5 "
            "(minute hour day-of-month month day-of-week)"
        )
    times = CronTimes(" ".join(fields), zone(timezone, schedule))
    try:
        times.next_after(datetime.now(UTC))
    except CronSimError as exc:
        raise InvalidArgument(f"schedule {schedule!r}: cron {expression!r} is invalid: {exc}") from None
    except StopIteration:
        raise InvalidArgument(f"schedule {schedule!r}: cron {expression!r} never fires") from None
    return times


def interval_times(every: object, timezone: str, schedule: str) -> IntervalTimes:
    """``every`` checked: a positive whole number of seconds, at most ten years."""
    if not isinstance(every, timedelta):
        validate.refuse(f"schedule {schedule!r}: every", "a datetime.timedelta", every)
    if every <= timedelta(0) or every % _SECOND or every > timedelta(days=3650):
        raise InvalidArgument(
            f"schedule {schedule!r}: every must be a positive whole number of seconds up to 3650 days, "
            f"got {validate.shown(every)}"
        )
    if timezone != "UTC":
        raise InvalidArgument(
            f"schedule {schedule!r}: timezone {timezone!r} applies to cron schedules only; every= ticks "
            "are counted from 1970-01-01T00:00Z (use cron for local times of day)"
        )
    return IntervalTimes(every // _SECOND)
