"""The codec: step outputs round-trip to their annotated type, encoding is canonical."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any, Dict, List, Union  # noqa: UP035  # the old spellings too

import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from runifold_sync.model.codec import (
    MAX_NESTING_DEPTH,
    NestedTooDeep,
    NotJsonable,
    _text_nests_within,
    from_json,
    structure,
    takes_any_json,
    to_json,
)


@attrs.frozen
class Reservation:
    order_id: str
    sku: str
    quantity: int


@dataclasses.dataclass(frozen=True)
class Charge:
    charge_id: str
    amount_cents: int
    captured: bool


@attrs.frozen
class Shipment:
    reservations: list[Reservation]
    charge: Charge
    shipped_at: datetime


def round_trip(value: Any, type_: Any) -> Any:
    """What a replayed step returns: the stored JSON text structured by the annotation."""
    return structure(from_json(to_json(value)), type_)


@pytest.mark.parametrize(
    ("value", "type_"),
    [
        (Reservation("o1", "sku-1", 2), Reservation),
        (Charge("ch_1", 1250, True), Charge),
        ("text", str),
        (42, int),
        (2.5, float),
        (True, bool),
        (None, type(None)),
        ([Reservation("o1", "a", 1), Reservation("o2", "b", 3)], list[Reservation]),
        ({"first": Charge("ch_1", 1, False), "second": Charge("ch_2", 2, True)}, dict[str, Charge]),
        ((1, "two", 3.0), tuple[int, str, float]),
        (datetime(2030, 5, 17, 8, 30, 15, 123456, tzinfo=UTC), datetime),
        (
            datetime(2030, 5, 17, 8, 30, tzinfo=timezone(timedelta(hours=2))),
            datetime,
        ),
        (
            Shipment(
                [Reservation("o1", "a", 1)],
                Charge("ch_9", 900, True),
                datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC),
            ),
            Shipment,
        ),
    ],
    ids=lambda v: type(v).__name__,
)
def test_step_output_round_trips_to_its_annotated_type(value: Any, type_: Any) -> None:
    restored = round_trip(value, type_)
    assert restored == value
    assert type(restored) is type(value)


def test_nested_containers_structure_their_elements_not_just_dicts() -> None:
    restored = round_trip({"a": [Reservation("o1", "s", 1)]}, dict[str, list[Reservation]])
    assert isinstance(restored["a"][0], Reservation)


def test_any_annotation_returns_a_copy_of_the_json_value() -> None:
    raw = from_json(to_json({"k": [1, 2, {"n": None}]}))
    given = structure(raw, Any)
    assert given == raw
    given["k"][2]["n"] = "changed by user code"  # the journal's form stays as recorded
    assert raw == {"k": [1, 2, {"n": None}]}


# Every string a store can keep: what UTF-8 can encode (no lone surrogates) but U+0000.
storable_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(storable_text, children, max_size=5),
    max_leaves=30,
)


@given(json_values)
def test_json_like_values_round_trip_unchanged(value: Any) -> None:
    assert from_json(to_json(value)) == value
    assert structure(from_json(to_json(value)), Any) == value


@given(st.dictionaries(storable_text, st.integers(), min_size=2, max_size=8))
def test_equal_dicts_in_any_key_order_encode_identically(mapping: dict[str, int]) -> None:
    reordered = dict(reversed(list(mapping.items())))
    assert list(reordered) != list(mapping)
    assert to_json(reordered) == to_json(mapping)


def test_nested_dicts_are_encoded_canonically_and_compactly() -> None:
    first = {"b": {"y": 1, "x": [2, {"q": 1, "p": 0}]}, "a": None}
    second = {"a": None, "b": {"x": [2, {"p": 0, "q": 1}], "y": 1}}
    assert to_json(first) == to_json(second) == '{"a":null,"b":{"x":[2,{"p":0,"q":1}],"y":1}}'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object(), {"k": [1, float("nan")]}])
def test_values_that_are_not_strict_json_raise_not_jsonable(value: Any) -> None:
    with pytest.raises(NotJsonable):
        to_json(value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("a\x00b", "contains U+0000"),
        ({"k": ["ok", "\ud800"]}, "contains a lone surrogate"),
        ({"\udfff": 1}, "contains a lone surrogate"),
    ],
    ids=["nul", "surrogate-in-list", "surrogate-key"],
)
def test_strings_no_store_can_keep_raise_not_jsonable_naming_the_character(value: Any, problem: str) -> None:
    with pytest.raises(NotJsonable, match=re.escape(problem)):
        to_json(value)


def test_non_ascii_text_and_escaped_backslashes_still_encode() -> None:
    value = {"name": "訂單 ✓", "path": "C:\\u0000"}
    assert from_json(to_json(value)) == value


def test_encoded_text_is_standard_json() -> None:
    text = to_json(Shipment([], Charge("c", 1, False), datetime(2030, 1, 1, tzinfo=UTC)))
    assert json.loads(text)["charge"] == {"amount_cents": 1, "captured": False, "charge_id": "c"}


def test_sets_encode_in_sorted_order_so_equal_sets_give_equal_text() -> None:
    forward = {f"item-{n}" for n in range(50)}
    backward = set(sorted(forward, reverse=True))
    assert to_json({"s": forward}) == to_json({"s": backward})
    assert to_json(frozenset({3, 1, 2})) == "[1,2,3]"


def _depth(value: Any) -> int:
    """Reference nesting depth, by plain recursion (fine for the small values here)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


# Strings full of brackets, quotes and backslashes: what could fool a measure of the text.
tricky_text = st.text(alphabet='[]{}"\\a\n', max_size=6)
tricky_values = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4),
    max_leaves=30,
)


@given(tricky_values, st.integers(min_value=1, max_value=6))
@example(["]", [[]], "["], 2)
def test_a_depth_limit_refuses_exactly_the_values_nested_deeper(value: Any, limit: int) -> None:
    if _depth(value) > limit:
        with pytest.raises(NestedTooDeep, match=f"^nests deeper than {limit} levels$"):
            to_json(value, max_depth=limit)
    else:
        assert to_json(value, max_depth=limit) == to_json(value)


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@given(tricky_values, st.integers(min_value=1, max_value=6))
# Strings whose brackets balance the real ones: the text alone would look 2 deep.
@example(["]", [[]], "["], 2)
@example({"]": [[]], "k": '[\\"{'}, 2)
def test_the_text_measure_never_clears_a_value_nested_deeper_and_is_exact_without_bracketed_strings(
    value: Any, limit: int
) -> None:
    within = _text_nests_within(to_json(value), limit)
    if within:
        assert _depth(value) <= limit
    if not any(ch in s for s in _strings(value) for ch in "[]{}"):
        assert within == (_depth(value) <= limit)


def test_a_wide_value_is_within_the_limit_and_one_level_past_it_is_refused() -> None:
    records = [{"id": n, "tags": ["a", "b"], "meta": {"x": [n]}} for n in range(1000)]
    deepest: Any = records
    for _ in range(MAX_NESTING_DEPTH - 4):  # records nest 4 deep
        deepest = [deepest]
    assert _depth(deepest) == MAX_NESTING_DEPTH
    assert to_json(deepest, max_depth=MAX_NESTING_DEPTH) == to_json(deepest)
    with pytest.raises(NestedTooDeep):
        to_json([deepest], max_depth=MAX_NESTING_DEPTH)


def test_a_value_that_contains_itself_is_refused_as_nesting_too_deep() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(NestedTooDeep, match=f"nests deeper than {MAX_NESTING_DEPTH} levels"):
        to_json(loop, max_depth=MAX_NESTING_DEPTH)
    with pytest.raises(NotJsonable, match="RecursionError"):  # without a limit: no depth claim
        to_json(loop)


@pytest.mark.parametrize(
    ("annotation", "takes_all"),
    [
        (Any, True),
        (object, True),
        (object | None, True),
        (Annotated[object, ["unhashable metadata"]], True),
        (str | int | float | bool | None | list[Any] | dict[str, Any], True),
        (Union[str, int, float, bool, None, List, Dict], True),  # noqa: UP006, UP007
        (str | int | float | None | list[Any] | dict[str, Any], False),  # no bool
        (str | int | float | bool | None | list[int] | dict[str, Any], False),
        (str | int | float | bool | None | list[Any] | dict[int, Any], False),
        (str, False),
        (dict[str, Any], False),
        (type(None), False),
    ],
    ids=repr,
)
def test_which_annotations_take_every_json_value_as_it_is(annotation: Any, takes_all: bool) -> None:
    assert takes_any_json(annotation) is takes_all
    if takes_all:
        assert structure({"k": [1, "a", None]}, annotation) == {"k": [1, "a", None]}
