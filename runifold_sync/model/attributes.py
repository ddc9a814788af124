"""Search attributes: typed values a workflow sets on its task (``ctx.set_attributes``)
so that operators find it by business facts ("the orders of customer c-42") rather
than by task id.

A value is one of five kinds: text, integer, number, boolean, time. The store keeps each
as its kind and a canonical text, so that a filter matches by equality on an index of
(key, kind, text), whichever database holds it: equal values of one kind give equal
text (a time is kept in UTC to the microsecond, a number as Python's shortest ``repr``).
An integer filter does not match a number attribute: ``120`` and ``120.0`` are different
kinds, as the kind a workflow set is part of what it said.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime

import attrs

from ..errors import InvalidArgument
from . import validate
from .validate import INT64_MAX, INT64_MIN

AttributeValue = str | int | float | bool | datetime

MAX_TEXT_CHARS = 1000  # a text attribute is a fact to search by, not a document
MAX_ATTRIBUTES = 64  # per call, and per filter


class AttributeKind(enum.Enum):
    TEXT = "text"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    TIME = "time"


@attrs.frozen
class Attribute:
    """One attribute as the store keeps it: its key, kind and canonical text."""

    key: str
    kind: AttributeKind
    text: str

    @property
    def value(self) -> AttributeValue:
        """The Python value the canonical text stands for."""
        return decode(self.kind, self.text)


def encode(key: str, value: object) -> Attribute:
    """``value`` of attribute ``key`` checked and made canonical; InvalidArgument naming
    the key and the value for anything but the five kinds."""
    validate.name("attribute key", key)
    field = f"attribute {key!r}"
    if isinstance(value, bool):  # before int: True is an int to Python
        return Attribute(key, AttributeKind.BOOLEAN, "true" if value else "false")
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            validate.refuse(field, "a 64-bit integer", value)
        return Attribute(key, AttributeKind.INTEGER, str(int(value)))
    if isinstance(value, float):
        if not math.isfinite(value):
            validate.refuse(field, "a finite number", value)
        return Attribute(key, AttributeKind.NUMBER, repr(float(value) + 0.0))  # -0.0 as 0.0
    if isinstance(value, datetime):
        validate.moment(field, value)
        return Attribute(key, AttributeKind.TIME, value.astimezone(UTC).isoformat(timespec="microseconds"))
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            validate.refuse(field, f"at most {MAX_TEXT_CHARS} characters", value)
        validate.text(field, value)  # no NUL, no lone surrogate: what every store keeps
        return Attribute(key, AttributeKind.TEXT, value)
    validate.refuse(field, "text, an integer, a number, a boolean or an aware datetime", value)


def encode_all(what: str, values: object) -> list[Attribute]:
    """A mapping of attributes (``set_attributes``' keywords, a filter) checked whole
    before anything is written or read."""
    if not isinstance(values, Mapping):
        validate.refuse(what, "a mapping of key to value", values)
    if len(values) > MAX_ATTRIBUTES:
        raise InvalidArgument(f"{what} must hold at most {MAX_ATTRIBUTES} attributes, got {len(values)}")
    return [encode(key, value) for key, value in values.items()]


def decode(kind: AttributeKind, text: str) -> AttributeValue:
    if kind is AttributeKind.TEXT:
        return text
    if kind is AttributeKind.INTEGER:
        return int(text)
    if kind is AttributeKind.NUMBER:
        return float(text)
    if kind is AttributeKind.BOOLEAN:
        return text == "true"
    return datetime.fromisoformat(text)


def filter_json(attributes: list[Attribute]) -> str:
    """The filter as the list queries take it: a JSON array of {key, kind, value}."""
    return json.dumps([{"key": a.key, "kind": a.kind.value, "value": a.text} for a in attributes])


_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?[0-9]+\.[0-9]*([eE][-+]?[0-9]+)?|-?[0-9]+[eE][-+]?[0-9]+")


def parse_where(condition: str) -> tuple[str, AttributeValue]:
    """``key=value`` as the command line (``list --where``) and the dashboard give it,
    the value's kind read from its form: ``true``/``false`` a boolean, digits an integer,
    a decimal point or exponent a number, an ISO 8601 time with an offset a time, and
    anything else text; a value in double quotes is text as it stands inside them
    (``--where code='"120"'``)."""
    if not isinstance(condition, str) or "=" not in condition:
        validate.refuse("where", "key=value", condition)
    key, _, text = condition.partition("=")
    key = key.strip()
    validate.name("where key", key)
    value: AttributeValue
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        value = text[1:-1]
    elif text in ("true", "false"):
        value = text == "true"
    elif _INTEGER.fullmatch(text):
        value = int(text)
    elif _NUMBER.fullmatch(text):
        value = float(text)
    else:
        value = _time(text) or text
    encode(key, value)  # refused here, naming the condition's key, not at the query
    return key, value


def _time(text: str) -> datetime | None:
    if not re.match(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ]", text):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None
