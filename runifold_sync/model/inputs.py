"""A workflow's input, structured into its main function's annotation: strictly, field by
field, with every wrong field named.

Inputs come from outside (a web handler, the CLI, a cron script), so one that does not fit
is refused where it is enqueued (``WorkflowRegistry.task``) rather than found inside a
worker, and the refusal lists each field with its path and reason (cattrs'
``transform_error``), not "While structuring Invoice (1 sub-exception)".

Strict means a JSON value is taken only as what it already is: the string ``"7"`` is not
an integer, ``1`` is not a string, ``"abc"`` is not a list of characters, and a key the
class does not have is an error rather than dropped (a misspelt optional field would
otherwise silently take its default). A definition that wants cattrs' coercions asks for
them with ``WorkflowDefinition(coerce_input=True)``.

A step's or effect's output is held to its return annotation as strictly, once, when the
body returns it (``fit_output``): a step annotated ``-> str`` that returns 42 is a
programming error, not a ``"42"``. What a journal recorded, results and signal payloads
are structured by the codec's converter as before: they were written by this engine (or
a release before it), and replaying a stored checkpoint must give the workflow what it
gave it the first time.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import (
    Callable,
    Mapping,
    MutableMapping,
    MutableSequence,
    MutableSet,
    Sequence,
    Set,
)
from typing import Any

import attrs
from cattrs import transform_error
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.errors import ForbiddenExtraKeysError, IterableValidationError, IterableValidationNote
from cattrs.preconf.json import make_converter
from cattrs.v import format_exception

from ..errors import InputMismatch
from . import validate
from .codec import converter as lax_converter
from .codec import copied, takes_any_json

# The path every problem starts from: ``input.lines[0].qty``.
ROOT = "input"


class _WrongType(TypeError):
    """A JSON value of another kind than the annotation wants; its text is the reason."""

    def __init__(self, expected: str, value: object) -> None:
        super().__init__(f"expected {expected}, got {_described(value)}")


def _described(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = validate.shown(value)
        return f"the string {text if len(text) <= 60 else text[:57] + '...'}"
    if isinstance(value, (int, float)):
        return f"the number {validate.shown(value)}"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _scalar(expected: str, accepts: Callable[[object], bool]) -> Callable[[Any, Any], Any]:
    def structure_scalar(value: Any, _type: Any) -> Any:
        if not accepts(value):
            raise _WrongType(expected, value)
        return value

    return structure_scalar


def _structure_float(value: Any, _type: Any) -> float:
    # JSON has one kind of number: an integer is a float's value, converted, not coerced.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _WrongType("a number", value)


strict = make_converter(forbid_extra_keys=True)
strict.register_structure_hook(str, _scalar("a string", lambda v: isinstance(v, str)))
strict.register_structure_hook(bool, _scalar("true or false", lambda v: isinstance(v, bool)))
strict.register_structure_hook(
    int, _scalar("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
)
strict.register_structure_hook(float, _structure_float)
strict.register_structure_hook(type(None), _scalar("null", lambda v: v is None))


def _origin(type_: Any) -> Any:
    return typing.get_origin(type_) or type_


# Containers: the hook cattrs would make, on this converter (so items are strict too),
# behind a check that the JSON value is the container the annotation wants. An array
# becomes what cattrs makes of it: a Sequence a tuple, an abstract Set a frozenset.
_ARRAYS: dict[Any, Callable[[list[Any]], Any]] = {
    list: list,
    MutableSequence: list,
    tuple: tuple,
    Sequence: tuple,
    set: set,
    MutableSet: set,
    frozenset: frozenset,
    Set: frozenset,
}
_OBJECTS = (dict, Mapping, MutableMapping)


def _array_hook(type_: Any) -> Callable[[Any, Any], Any]:
    origin = _origin(type_)
    args = typing.get_args(type_)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return _fixed_tuple_hook(type_, args)
    items = list_structure_factory(list[args[0] if args else Any], strict)  # type: ignore[misc,arg-type]
    build = _ARRAYS[origin]

    def structure_array(value: Any, _type: Any) -> Any:
        if not isinstance(value, list):
            raise _WrongType("an array", value)
        return build(items(value, list))

    return structure_array


def _fixed_tuple_hook(type_: Any, item_types: tuple[Any, ...]) -> Callable[[Any, Any], Any]:
    expected = f"an array of {len(item_types)}"

    def structure_tuple(value: Any, _type: Any) -> Any:
        if not isinstance(value, list) or len(value) != len(item_types):
            raise _WrongType(expected, value)
        parts = [
            _Part(item, item_type, index, f"Structuring {type_!r} @ index {index}")
            for index, (item, item_type) in enumerate(zip(value, item_types, strict=True))
        ]
        return tuple(_each_or_all_errors(parts, strict.structure, type_))

    return structure_tuple


def _object_hook(type_: Any) -> Callable[[Any, Any], Any]:
    args = typing.get_args(type_)
    key_type = args[0] if len(args) == 2 else Any
    inner = mapping_structure_factory(type_, strict, key_type=Any)

    def structure_object(value: Any, _type: Any) -> Any:
        if not isinstance(value, dict):
            raise _WrongType("an object", value)
        return inner(_keys(value, key_type, type_), type_)

    return structure_object


def _keys(value: dict[str, Any], key_type: Any, type_: Any) -> dict[Any, Any]:
    """JSON keys are strings, so a key annotated as another type (``dict[int, str]``) is
    converted from its text, which is the one coercion JSON forces."""
    if key_type in (Any, str):
        return value
    parts = [_Part(key, key_type, key, f"Structuring mapping key @ key {key!r}") for key in value]
    keys = _each_or_all_errors(parts, lax_converter.structure, type_)
    return dict(zip(keys, value.values(), strict=True))


@attrs.frozen
class _Part:
    """One item (or key) of a collection to structure, and where it stands in it."""

    value: Any
    type: Any
    where: Any
    note: str


def _each_or_all_errors(parts: list[_Part], structure: Callable[[Any, Any], Any], type_: Any) -> list[Any]:
    """Each part structured, or every failure at once: cattrs' own grouped error, each
    failure noted with where it was (``transform_error`` turns the notes into paths)."""
    done: list[Any] = []
    errors: list[Exception] = []
    for part in parts:
        try:
            done.append(structure(part.value, part.type))
        except Exception as exc:
            note = IterableValidationNote(part.note, part.where, part.type)
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]
            errors.append(exc)
    if errors:
        raise IterableValidationError(f"While structuring {type_!r}", errors, type_)
    return done


def _record_hook(type_: Any) -> Callable[[Any, Any], Any]:
    inner = strict.gen_structure_attrs_fromdict(type_)

    def structure_record(value: Any, _type: Any) -> Any:
        if not isinstance(value, dict):
            raise _WrongType(f"an object for {_origin(type_).__name__}", value)
        return inner(value, type_)

    return structure_record


def _is_record(type_: Any) -> bool:
    origin = _origin(type_)
    return isinstance(origin, type) and (attrs.has(origin) or dataclasses.is_dataclass(origin))


strict.register_structure_hook_factory(lambda t: _origin(t) in _ARRAYS, _array_hook)
strict.register_structure_hook_factory(lambda t: _origin(t) in _OBJECTS, _object_hook)
strict.register_structure_hook_factory(_is_record, _record_hook)


def _reason(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _WrongType):
        return str(exc)
    if isinstance(exc, (KeyError, ForbiddenExtraKeysError)):
        return format_exception(exc, type_)
    # A validator of the class, an enum or literal that has no such value, or a coercion
    # the lax converter tried: their own words say what is wrong ("'amount' must be >= 0").
    text = str(exc) or type(exc).__name__
    return text if type_ is None else f"{format_exception(exc, type_)} ({text})"


def problems(exc: Exception, root: str = ROOT) -> list[str]:
    """Each wrong field of a failed structuring as ``path: reason``, paths starting
    from ``root``."""
    found = []
    for line in transform_error(exc, root, _reason):
        reason, _, path = line.rpartition(" @ ")
        found.append(f"{path}: {reason}")
    return found


def type_name(type_: Any) -> str:
    """How an error names the annotation: ``flows.Invoice``, ``list[int]``."""
    if isinstance(type_, type) and not typing.get_args(type_):
        module = type_.__module__
        return type_.__qualname__ if module == "builtins" else f"{module}.{type_.__qualname__}"
    return repr(type_)


# Annotations a decoded JSON scalar of exactly that type fits as it is: the strict and
# the lax converters' hooks for them return such a value unchanged (as float(value) for
# a float, int(value) for an int...).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def fit_input(raw: Any, type_: Any, *, coerce: bool, what: str = "input") -> Any:
    """``raw`` (decoded JSON) structured as ``type_``; ``coerce`` allows what cattrs'
    converter allows. Raises :class:`InputMismatch` naming every wrong field. A scalar of
    exactly its annotation is what either converter would return: returned at once."""
    if type(raw) is type_ and type_ in _SCALARS:
        return raw
    if type_ is None or type_ is type(None) or takes_any_json(type_):
        return raw
    try:
        return (lax_converter if coerce else strict).structure(raw, type_)
    except Exception as exc:
        raise InputMismatch(what, type_name(type_), problems(exc)) from exc


def fit_output(raw: Any, type_: Any, text: str | None = None) -> Any:
    """A body's output as it returned it (``raw``, decoded from its canonical ``text``)
    as its return annotation ``type_``, strictly, for the main function: a copy, so what
    that does to it leaves the journal entry alone. Raises what the strict converter
    raises (:func:`problems` names each wrong field). A scalar of exactly its annotation
    (most step outputs) is what the converter would return: it is returned at once."""
    if type(raw) is type_ and type_ in _SCALARS:
        return raw
    raw = copied(raw, text)
    if takes_any_json(type_):
        return raw
    return strict.structure(raw, type_)
