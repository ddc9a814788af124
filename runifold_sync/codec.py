"""The one cattrs converter used for inputs, step outputs, results and checkpoints.

Everything that reaches the store goes through here, so a value that cannot become
strict JSON (no NaN, no arbitrary objects) is caught at the call that produced it.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from cattrs.preconf.json import make_converter

T = TypeVar("T")

converter = make_converter()

# One encoder for every canonical text: ``json.dumps`` with options builds a new encoder
# on each call, which showed up on the per-step hot path.
CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def _unstructure_set(values: set[Any] | frozenset[Any]) -> list[Any]:
    # Sets iterate in hash order, which differs between processes for strings; sorting
    # by encoded form keeps equal values equal in text (enqueue idempotency relies on it).
    items = [converter.unstructure(v) for v in values]
    return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=repr))


converter.register_unstructure_hook(set, _unstructure_set)
converter.register_unstructure_hook(frozenset, _unstructure_set)


class NotJsonable(TypeError):
    """Raised by :func:`to_json` with a description of what could not be encoded."""


def unstructure(value: Any) -> Any:
    """Turn attrs classes, dataclasses, enums and datetimes into JSON-ready values."""
    return converter.unstructure(value)


def structure(raw: Any, type_: Any) -> Any:
    """Rebuild a value of ``type_`` from its JSON form; ``Any`` returns ``raw`` as is."""
    if type_ is Any or type_ is None or type_ is type(None):
        return raw
    return converter.structure(raw, type_)


def _unstorable_string(raw: Any) -> str | None:
    """The first string in ``raw`` that a store could not keep, described, or None.

    PostgreSQL's JSONB refuses U+0000 and lone surrogates. Refusing them on every
    backend keeps the stores interchangeable, and refusing them here, where the value was
    produced, fails the one task closed instead of surfacing later as a store error that
    looks like an outage and gets the task claimed again and again.
    """
    if isinstance(raw, str):
        if "\x00" in raw:
            return f"{raw[:40]!r} contains U+0000"
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            return f"{raw[:40]!r} contains a lone surrogate"
        return None
    if isinstance(raw, dict):
        return next(filter(None, map(_unstorable_string, [*raw.keys(), *raw.values()])), None)
    if isinstance(raw, (list, tuple)):
        return next(filter(None, map(_unstorable_string, raw)), None)
    return None


def _encode(value: Any) -> tuple[Any, str]:
    """The JSON form of ``value`` and its canonical text (sorted keys, compact)."""
    try:
        raw = unstructure(value)
        text = CANONICAL_ENCODER.encode(raw)
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotJsonable(f"{type(exc).__name__}: {exc}") from exc
    # Both characters only ever appear escaped as \u.... (the encoder is ASCII-only), so
    # the walk is needed only for text that holds an escape at all.
    if "\\u" in text and (problem := _unstorable_string(raw)) is not None:
        raise NotJsonable(f"string {problem}, which no store can keep")
    return raw, text


def to_json(value: Any) -> str:
    """Encode a value canonically so equal values give equal text."""
    return _encode(value)[1]


def to_jsonable(value: Any) -> Any:
    """The JSON form a checkpoint keeps of ``value``, checked to encode as strict JSON."""
    return _encode(value)[0]


def from_json(text: str) -> Any:
    return json.loads(text)
