"""The checks a value passes where it enters the package, and nowhere else.

Every check is a function ``check(field, value)`` that returns the value (or the form it
is kept in) or raises :class:`InvalidArgument` saying ``"<field> must be <what>, got
<value>"``, the value shown by :func:`shown`. Public store methods, decorators, settings,
the CLI and the dashboard call them; the package's own typed calls trust their arguments
(mypy --strict checks those). :func:`field` and :func:`validator` put a check on an attrs
field, naming the field by its attribute name.
"""

from __future__ import annotations

import functools
import math
import re
import reprlib
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

import attrs

from ..errors import InvalidArgument
from .codec import MAX_NESTING_DEPTH, NestedTooDeep, NotJsonable, from_json, to_json

T = TypeVar("T")
Check = Callable[[str, Any], Any]

# Integers a store keeps are 64-bit (SQLite INTEGER, PostgreSQL BIGINT); durations it
# keeps or adds to its clock stay far inside what a datetime and a 64-bit count of
# microseconds hold. Both bounds are checked where a value enters, so the database never
# sees one it would refuse (PostgreSQL's refusal would read as an outage).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DURATION = timedelta(days=3650)
# The moments a store keeps (a task's not_before, a timer's deadline): timezone-aware and,
# in UTC, a day inside datetime's range. Past it Python cannot hold the moment in UTC, so
# every read of its row would fail; the day's margin covers a float timestamp's rounding
# and a PostgreSQL session reading it in another time zone.
EARLIEST_MOMENT = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)
LATEST_MOMENT = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)
NAME_MAX = 200
_FLOAT_MAX = sys.float_info.max

# A bad value may be huge, nested deeper than repr() follows, or an integer too long to print.
_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 6, 160, 160


def shown(value: object) -> str:
    """A bad value as every message shows it: its ``repr``, cut to a readable length."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    try:
        return _BOUNDED.repr(value)
    except Exception:  # a repr that raises: say what it is instead
        return f"a {type(value).__name__}"


def refuse(field: str, must: str, value: object) -> NoReturn:
    """Raise the one message shape: ``<field> must be <must>, got <value>``."""
    raise InvalidArgument(f"{field} must be {must}, got {shown(value)}")


# --- names and text -----------------------------------------------------------------


def name(field: str, value: object) -> str:
    """A name (a key, a tenant, a queue): printable text, trimmed, at most :data:`NAME_MAX`
    characters. Names become database keys and log fields."""
    if not isinstance(value, str):
        refuse(field, "a string", value)
    if not value or value != value.strip():
        refuse(field, "non-empty without surrounding spaces", value)
    if len(value) > NAME_MAX:
        refuse(field, f"at most {NAME_MAX} characters", value)
    if not value.isprintable():
        surrogate = next((ch for ch in value if "\ud800" <= ch <= "\udfff"), None)
        if surrogate is not None:  # no character at all: what undecodable bytes in argv become
            raise InvalidArgument(
                f"{field} contains a lone surrogate U+{ord(surrogate):04X}, which is not a Unicode "
                f"character (was it made from bytes that are not UTF-8?): {shown(value)}"
            )
        raise InvalidArgument(f"{field} contains control characters: {shown(value)}")
    return value


def names(
    field: str, value: object, *, kind: str = "name", shape: str = "an iterable of names"
) -> frozenset[str]:
    """Declared names (signals, capabilities, approvers), each checked as a :func:`name`
    called ``kind``: an iterable, never a string, whose letters iterating would declare
    one by one ("net" as {"n", "e", "t"})."""
    if isinstance(value, str):
        raise InvalidArgument(f"{field} must be {shape}, got the string {shown(value)}; write [{value!r}]")
    if not isinstance(value, Iterable):
        refuse(field, shape, value)
    return frozenset(name(kind, n) for n in value)


def matching(pattern: str, what: str) -> Callable[[str, Any], str]:
    """The check of a string that must match ``pattern`` whole (an id with an alphabet
    of its own), refused as ``<field> must be <what>``."""
    compiled = re.compile(pattern)

    def check(field: str, value: object) -> str:
        if not isinstance(value, str) or not compiled.fullmatch(value):
            refuse(field, what, value)
        return value

    return check


def text(field: str, value: object) -> str:
    """A string looked up or kept as it is (a task id, a key): no NUL (PostgreSQL text
    cannot hold one) and no lone surrogate (UTF-8 cannot encode one), refused here the
    same on every backend rather than as a driver error."""
    if not isinstance(value, str):
        refuse(field, "a string", value)
    if "\x00" in value:
        raise InvalidArgument(f"{field} must not contain a NUL character, got {shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        refuse(field, "text UTF-8 can encode (no lone surrogates)", value)
    return value


def free_text(field: str, value: object) -> str:
    """Free text (a reason, often an exception's message): any string; the store makes
    it storable rather than refusing it, since refusing would lose what it records."""
    if not isinstance(value, str):
        refuse(field, "a string", value)
    return value


_KIND_NAMES: dict[type, str] = {str: "string", int: "integer", bool: "bool"}


def instance(field: str, value: object, kind: type[T] | tuple[type, ...]) -> T:
    """``value`` if it is a ``kind`` (a class or a tuple of classes)."""
    if not isinstance(value, kind):
        what = " or ".join(
            _KIND_NAMES.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,))
        )
        refuse(field, f"a {what}", value)
    return value  # type: ignore[return-value]


def flag(field: str, value: object) -> bool:
    """True or False, never a truthy stand-in."""
    if value is not True and value is not False:
        refuse(field, "True or False", value)
    return value


# --- numbers --------------------------------------------------------------------------


def integer(field: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (``bool`` refused, though Python counts it as one) within
    ``minimum``..``maximum`` where given."""
    if isinstance(value, int) and not isinstance(value, bool):
        if (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
            return value
    if minimum is None and maximum is None:
        bounds = ""
    elif maximum is None:
        bounds = f" >= {minimum}"
    elif minimum is None:
        bounds = f" <= {maximum}"
    else:
        bounds = f" in {minimum}..{maximum}"
    refuse(field, f"an integer{bounds}", value)


def stored_int(field: str, value: object, *, minimum: int = INT64_MIN) -> int:
    """An integer a store keeps: within ``minimum``..2**63-1."""
    return integer(field, value, minimum=minimum, maximum=INT64_MAX)


def count(field: str, value: object) -> int:
    """A count (attempts, processes, tasks): an integer >= 1."""
    return integer(field, value, minimum=1)


def version(field: str, value: object) -> int:
    """A definition version: an integer a store keeps, >= 1."""
    return stored_int(field, value, minimum=1)


def number(field: str, value: object) -> float:
    """A finite number > 0 (``bool`` refused). NaN and infinity would make a limit or a
    factor that means nothing."""
    if not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= _FLOAT_MAX:
        return value
    refuse(field, "a finite number > 0", value)


def cost(field: str, value: object, total: float = 0.0) -> float:
    """``total`` plus a cost (a finite number >= 0), refused when the sum is past the
    largest float: usage is stored as JSON, which has no infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= _FLOAT_MAX:
        refuse(field, "a finite number >= 0", value)
    added = total + float(value)
    if not math.isfinite(added):
        raise InvalidArgument(
            f"{field} {shown(value)} added to {total!r} already counted is past the largest float "
            f"({_FLOAT_MAX:g}): a total cost must stay finite"
        )
    return added


# --- durations and moments ----------------------------------------------------------


def duration(
    field: str, value: object, *, minimum: timedelta = timedelta(0), above: bool = False
) -> timedelta:
    """A timedelta of at least ``minimum`` (``above``: more than it) and at most
    :data:`MAX_DURATION` either way, the longest a store keeps or adds to its clock."""
    if not isinstance(value, timedelta):
        refuse(field, "a datetime.timedelta", value)
    if abs(value) > MAX_DURATION:
        refuse(field, f"at most {MAX_DURATION.days} days", value)
    if value < minimum or (above and value == minimum):
        refuse(field, _lower_bound(minimum, above), value)
    return value


def _lower_bound(minimum: timedelta, above: bool) -> str:
    if not minimum:
        return "positive" if above else "non-negative"
    return f"{'above' if above else 'at least'} {minimum.total_seconds():g} s"


def positive_duration(field: str, value: object) -> timedelta:
    """A timedelta longer than zero, up to :data:`MAX_DURATION`."""
    return duration(field, value, above=True)


def any_duration(field: str, value: object) -> timedelta:
    """A timedelta of either sign, at most :data:`MAX_DURATION` long (an offset, a delay)."""
    return duration(field, value, minimum=-MAX_DURATION)


def seconds(field: str, value: object, *, minimum_s: float = 0.0) -> timedelta:
    """A duration given as a number of seconds (a CLI option, a setting): finite, from
    ``minimum_s`` up to :data:`MAX_DURATION`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not minimum_s <= value <= MAX_DURATION.total_seconds()
    ):
        refuse(field, f"a number of seconds from {minimum_s:g} to {MAX_DURATION.total_seconds():.0f}", value)
    return timedelta(seconds=value)


def moment(field: str, value: object) -> datetime:
    """A moment a store keeps: an aware datetime (its tzinfo gives an offset), from
    :data:`EARLIEST_MOMENT` to :data:`LATEST_MOMENT` once in UTC."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        refuse(field, "a timezone-aware datetime", value)
    try:
        offset = value.utcoffset()
    except (TypeError, ValueError) as exc:  # a tzinfo returning a bad offset
        refuse(field, f"a datetime whose tzinfo gives an offset (utcoffset() failed: {exc})", value)
    if offset is None:
        raise InvalidArgument(
            f"{field} must be a timezone-aware datetime, got {shown(value)} "
            "whose tzinfo's utcoffset() is None"
        )
    if not EARLIEST_MOMENT <= value <= LATEST_MOMENT:  # aware comparison: never overflows
        refuse(field, f"from {EARLIEST_MOMENT.isoformat()} to {LATEST_MOMENT.isoformat()} in UTC", value)
    return value


# --- JSON ---------------------------------------------------------------------------


def json_text(
    field: str, value: Any, *, limit: int, instead: str = "store it outside and pass its id"
) -> str:
    """``value``'s canonical JSON text, refused (naming ``field``) when it is not JSON,
    nests past :data:`~runifold_sync.model.codec.MAX_NESTING_DEPTH` or is over ``limit``
    bytes encoded (``instead`` says what to do with large data)."""
    try:
        encoded = to_json(value, max_depth=MAX_NESTING_DEPTH)
    except NestedTooDeep as exc:
        raise InvalidArgument(f"{field} {exc}") from exc
    except NotJsonable as exc:
        raise InvalidArgument(f"{field} is not JSON-serializable: {exc}; got {shown(value)}") from exc
    size = len(encoded.encode())
    if size > limit:
        raise InvalidArgument(
            f"{field} is {size} bytes encoded, over the limit of {limit}; for large data, {instead}"
        )
    return encoded


def canonical_json(field: str, value: object, *, limit: int) -> str:
    """Text kept as it is given (a task's input): JSON text in the canonical form
    :func:`json_text` makes (sorted keys, compact, ASCII-only), within its checks. Text a
    worker could not decode is refused, and so is JSON in another form: two texts of one
    value would read as two different inputs to enqueue's idempotency."""
    given = instance(field, value, str)
    try:
        decoded = from_json(given)
    except (ValueError, RecursionError) as exc:
        refuse(field, f"JSON text ({exc})", given)
    if json_text(field, decoded, limit=limit) != given:
        refuse(
            field,
            "canonical JSON text (sorted keys, no spaces, ASCII-only), as codec.to_json writes it",
            given,
        )
    return given


# --- composing and attrs ------------------------------------------------------------


def optional(check: Check) -> Check:
    """``check`` that lets None through."""

    @functools.wraps(check)
    def allow_none(field: str, value: object) -> object:
        return None if value is None else check(field, value)

    return allow_none


def bounded_by(check: Callable[..., T], **bounds: Any) -> Callable[[str, Any], T]:
    """``check`` with its keyword bounds fixed: ``bounded_by(integer, minimum=1, maximum=9)``."""
    return functools.partial(check, **bounds)


def is_a(kind: type[T] | tuple[type, ...]) -> Callable[[str, Any], T]:
    """The check :func:`instance` of ``kind``."""
    return functools.partial(instance, kind=kind)


def validator(
    check: Check, *, name: str | None = None, prefix: bool = False
) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator running ``check`` under ``name``, else the attribute's name
    (``prefix``: as ``Class.attribute``; run on the class itself, it checks a value
    before an instance exists)."""

    def run(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        field = name or attribute.name
        owner = inst if isinstance(inst, type) else type(inst)
        check(f"{owner.__name__}.{field}" if prefix else field, value)

    return run


def field(
    check: Check,
    default: Any = attrs.NOTHING,
    *,
    name: str | None = None,
    prefix: bool = False,
    **kwargs: Any,
) -> Any:
    """An attrs field checked by ``check`` (see :func:`validator`), kept in its metadata
    (``"check"``) so that a reader of settings can run it under the key it was read from."""
    return attrs.field(
        default=default,
        validator=validator(check, name=name, prefix=prefix),
        metadata={"check": check},
        **kwargs,
    )
