"""The one cattrs converter used for inputs, step outputs, results and checkpoints.

Everything that reaches the store goes through here, so a value that cannot become
strict JSON (no NaN, no arbitrary objects) is caught at the call that produced it.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from cattrs.preconf.json import make_converter

T = TypeVar("T")

converter = make_converter()

# One encoder for every canonical text: ``json.dumps`` with options builds a new encoder
# on each call, which showed up on the per-step hot path.
CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def c_encoder(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, calling the C encoder it would build itself.

    ``JSONEncoder.encode`` reaches the C encoder through ``iterencode``, which builds it
    anew on every call after two layers of Python: a step encodes its output, its journal
    entry and its checkpoint's head, and a claim and a transition their events, so those
    layers were a tenth of a step's calls. The C encoder is built here as ``iterencode``
    builds it (a new ``markers`` dict each time, for the circular-reference check); where
    the interpreter has none, or it does not give the same text on a sample,
    ``encoder.encode`` is used as it is."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.indent is not None:
        return encoder.encode
    default, circular = encoder.default, encoder.check_circular
    string = json.encoder.encode_basestring_ascii if encoder.ensure_ascii else json.encoder.encode_basestring
    options = (encoder.key_separator, encoder.item_separator, encoder.sort_keys, encoder.skipkeys)
    allow_nan = encoder.allow_nan

    def encode(value: Any) -> str:
        markers = {} if circular else None
        return "".join(make(markers, default, string, None, *options, allow_nan)(value, 0))

    sample = {"b": [1, 2.5, None, True, '\u00e9\n"', -0.0, 10**20], "a": {"c": {}}, "d": "x"}
    try:
        same = encode(sample) == encoder.encode(sample) and encode("y") == encoder.encode("y")
    except Exception:  # an interpreter whose C encoder takes other arguments
        same = False
    return encode if same else encoder.encode


# CANONICAL_ENCODER.encode, through the C encoder.
canonical_text = c_encoder(CANONICAL_ENCODER)


def _unstructure_set(values: set[Any] | frozenset[Any]) -> list[Any]:
    # Sets iterate in hash order, which differs between processes for strings; sorting
    # by encoded form keeps equal values equal in text (enqueue idempotency relies on it).
    items = [converter.unstructure(v) for v in values]
    return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=repr))


converter.register_unstructure_hook(set, _unstructure_set)
converter.register_unstructure_hook(frozenset, _unstructure_set)


class NotJsonable(TypeError):
    """Raised by :func:`to_json` with a description of what could not be encoded."""


# How deep an input, step output, workflow result or signal payload may nest. A value is
# decoded and re-encoded inside a worker, below the worker's own stack frames, by code
# that recurses once (or more) per level: an explicit limit keeps every such call far
# from the interpreter's recursion limit, so a value accepted where it was produced is
# never refused later where a worker holds it.
MAX_NESTING_DEPTH = 100


class NestedTooDeep(NotJsonable):
    """The value's JSON form nests lists and objects deeper than the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"nests deeper than {limit} levels")


def unstructure(value: Any) -> Any:
    """Turn attrs classes, dataclasses, enums and datetimes into JSON-ready values."""
    return converter.unstructure(value)


def structure(raw: Any, type_: Any, text: str | None = None) -> Any:
    """A value of ``type_`` for user code, rebuilt from the JSON form ``raw`` (for an
    annotation that admits every JSON value, the form itself)."""
    raw = copied(raw, text)
    if type_ is None or type_ is type(None) or takes_any_json(type_):
        return raw
    return converter.structure(raw, type_)


def copied(raw: Any, text: str | None = None) -> Any:
    """``raw`` for user code: a list or object read back from its text (``text`` when
    the caller has it), anything else as it is. What user code does to a value it got
    must not change the journal entry it came from, whose text a later commit writes and
    a replay gives back."""
    if isinstance(raw, (dict, list, tuple)):
        return from_json(to_json(raw) if text is None else text)
    return raw


# What a JSON value can be, as the annotation names each kind.
_JSON_KINDS = frozenset({str, bool, int, float, type(None), list, dict})


def takes_any_json(type_: Any) -> bool:
    """True when annotation ``type_`` admits every JSON value as it is: ``Any``,
    ``object``, a union with one of them, or a union with a member for each kind of JSON
    value (``str | int | float | bool | None | list[Any] | dict[str, Any]``). A value
    structured as one is the value itself (cattrs has no hook for ``object`` and does
    not take such a union apart)."""
    try:
        return _takes_any_json_cached(type_)
    except TypeError:  # unhashable (an Annotated's metadata): worked out each time
        return _takes_any_json(type_)


def _takes_any_json(type_: Any) -> bool:
    if type_ is Any or type_ is object:
        return True
    origin = typing.get_origin(type_)
    if origin is typing.Annotated:
        return takes_any_json(typing.get_args(type_)[0])
    if origin is not typing.Union and origin is not types.UnionType:
        return False
    members = typing.get_args(type_)
    return any(map(takes_any_json, members)) or {_json_kind(m) for m in members} >= _JSON_KINDS


_takes_any_json_cached = functools.lru_cache(maxsize=1024)(_takes_any_json)


def _json_kind(member: Any) -> Any:
    """The kind of JSON value ``member`` of a union takes whole (``list`` for a list of
    anything, ``dict`` for an object of anything), or None."""
    kind = next((kind for kind in _JSON_KINDS if member is kind), None)
    origin, args = typing.get_origin(member), typing.get_args(member)
    if origin is list and (not args or takes_any_json(args[0])):
        kind = list
    if origin is dict and (not args or (args[0] in (str, Any) and takes_any_json(args[1]))):
        kind = dict
    return kind


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


def _nesting_exceeds(value: Any, limit: int) -> bool:
    """True when lists, tuples, sets or dicts nest deeper than ``limit``; a top-level
    container is level 1. Iterative, so a value nested 100,000 deep (or one that
    contains itself) is measured without recursion."""
    containers = (dict, list, tuple, set, frozenset)
    stack = [(value, 1)] if isinstance(value, containers) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, containers))
    return False


# Keep the bytes that tell the structure of canonical JSON text (which is ASCII): the
# brackets, with "{}" turned into "[]", and the quotes around strings.
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')


def _text_nests_within(text: str, limit: int) -> bool:
    """True when canonical JSON ``text`` provably nests at most ``limit`` deep; False
    when it nests deeper or a string in it holds brackets (the walk then decides).

    Every step is a C-speed bytes method, so a 1000-record output is measured in a
    fraction of the time a walk of its values takes. Escaped backslashes and quotes are
    dropped first, so every quote left delimits a string; a string without brackets then
    reduces to an empty pair; each pass of removing "[]" takes off one level.
    """
    shape = text.encode()
    if b"\\" in shape:
        shape = shape.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = shape.translate(_BRACES_AS_BRACKETS, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in shape:
        return False
    for _ in range(limit):
        if not shape:
            return True
        shape = shape.replace(b"[]", b"")
    return not shape


def _encode(value: Any, max_depth: int | None) -> str:
    """The canonical text of ``value`` (sorted keys, compact), refused when it nests
    deeper than ``max_depth`` (None: no limit) or holds a string no store can keep; the
    checks read the value itself when the encoder took it as it is, else cattrs' form.

    A value the JSON encoder takes as it is (dicts, lists, tuples, strings, numbers,
    booleans, None: what step outputs and payloads mostly are) is encoded in one call of
    the C encoder; anything it refuses (attrs classes, datetimes, sets, NaN, a nesting
    too deep for it) cattrs unstructures first. The text is the one cattrs' form would
    give: unstructuring leaves such values as they are, and the encoder writes a
    non-string key, or a str or int subclass such as an enum member, as it would write
    cattrs' form of it. A 5.6 KB step output took 290 µs walked through cattrs and
    encoded, 85 µs encoded alone (measured)."""
    try:
        text = canonical_text(value)
        raw = value
    except (TypeError, ValueError, RecursionError):
        raw, text = _unstructured_text(value, max_depth)
    # Every level opens with "[" or "{", so text with at most ``max_depth`` of them
    # cannot nest deeper: its length or two counts settle almost every step output; the
    # text measure settles nearly all the rest, and the walk of the values only what it
    # cannot.
    if (
        max_depth is not None
        and len(text) > max_depth
        and text.count("[") + text.count("{") > max_depth
        and not _text_nests_within(text, max_depth)
        and _nesting_exceeds(raw, max_depth)
    ):
        raise NestedTooDeep(max_depth)
    # Both characters only ever appear escaped as \u.... (the encoder is ASCII-only), so
    # the walk is needed only for text that holds an escape at all.
    if "\\u" in text and (problem := _unstorable_string(raw)) is not None:
        raise NotJsonable(f"string {problem}, which no store can keep")
    return text


def _unstructured_text(value: Any, max_depth: int | None) -> tuple[Any, str]:
    """cattrs' form of ``value`` and its canonical text."""
    try:
        raw = unstructure(value)
        return raw, canonical_text(raw)
    except RecursionError as exc:
        # Either the value nests too deep for the recursive encoders or the caller's
        # stack was already deep; only the first is the value's fault.
        if max_depth is not None and _nesting_exceeds(value, max_depth):
            raise NestedTooDeep(max_depth) from exc
        raise NotJsonable(f"{type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's own 4,300-digit limit
            raise NotJsonable(
                "holds an integer of more than 4,300 digits, which JSON text cannot carry here"
            ) from exc
        raise NotJsonable(f"{type(exc).__name__}: {exc}") from exc
    except TypeError as exc:
        raise NotJsonable(f"{type(exc).__name__}: {exc}") from exc


def to_json(value: Any, *, max_depth: int | None = None) -> str:
    """Encode a value canonically so equal values give equal text. Values a user hands
    in (inputs, results, signal payloads) pass ``max_depth=MAX_NESTING_DEPTH``; records
    that wrap them, such as checkpoints, are encoded without a limit."""
    return _encode(value, max_depth)


def to_jsonable(value: Any) -> Any:
    """The JSON form a checkpoint keeps of a step output, checked to encode as strict
    JSON nested at most :data:`MAX_NESTING_DEPTH` deep: the value as its stored text
    reads back (a copy, so the caller changing its value later changes nothing kept)."""
    return from_json(_encode(value, MAX_NESTING_DEPTH))


def from_json(text: str) -> Any:
    """The value of JSON ``text``, as :func:`json.loads` reads it. Canonical text (no
    whitespace around the value) goes straight to the decoder's scanner, saving
    ``json.loads``' layers of Python calls on every step output a worker decodes; any
    other text (whitespace, a BOM, trailing data, not a string, no value at all) is left
    to ``json.loads``, which accepts or refuses it with its own error."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, TypeError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


# The scanner json.loads' default decoder reads a value with: the same decoding.
# (typeshed does not list the attribute every JSONDecoder sets.)
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def storable_text(text: str) -> str:
    """Free text (a reason built from an exception's message) that every store can hold:
    a lone surrogate, which Python strings allow and UTF-8 cannot encode, is written as
    its escape (``\\ud800``) instead of failing the write that records the failure."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
