"""The moments a store keeps, checked where they are given (a task's ``not_before``,
``ctx.sleep_until``), so that a moment no store could read back never reaches one."""

from __future__ import annotations

import reprlib
from datetime import UTC, datetime, timedelta

from ..errors import InvalidArgument

# The moments a store keeps (a task's not_before, a timer's deadline): timezone-aware and,
# in UTC, a day inside datetime's range. A moment past it is one Python cannot hold in
# UTC: SQLite (microseconds since the epoch) and PostgreSQL (timestamptz, up to year
# 294276) would keep it, and then every read of its row failed (OverflowError,
# DataError). The day's margin covers a float timestamp's rounding (a timer's journaled
# deadline) and a PostgreSQL session reading it in another time zone.
EARLIEST_MOMENT = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)
LATEST_MOMENT = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


def check_moment(kind: str, value: object) -> datetime:
    """A moment a store keeps: an aware datetime (its tzinfo gives an offset, not None),
    from :data:`EARLIEST_MOMENT` to :data:`LATEST_MOMENT` once in UTC."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        shown = repr(value) if isinstance(value, datetime) else reprlib.repr(value)
        raise InvalidArgument(f"{kind} must be a timezone-aware datetime, got {shown}")
    try:
        offset = value.utcoffset()
    except (TypeError, ValueError) as exc:  # a tzinfo returning a bad offset
        raise InvalidArgument(f"{kind} has a tzinfo whose utcoffset() failed: {exc}; got {value!r}") from exc
    if offset is None:
        raise InvalidArgument(
            f"{kind} must be a timezone-aware datetime, got {value!r} whose tzinfo's utcoffset() is None"
        )
    if not EARLIEST_MOMENT <= value <= LATEST_MOMENT:  # aware comparison: never overflows
        raise InvalidArgument(
            f"{kind} must be from {EARLIEST_MOMENT.isoformat()} to {LATEST_MOMENT.isoformat()} in UTC, "
            f"got {value!r}"
        )
    return value
