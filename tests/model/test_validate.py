"""The validation vocabulary: each check returns the value it accepts, refuses a bad one
naming the field and showing the value the one bounded way, and composes (optional,
bounded_by, attrs fields)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest

from runifold_sync.errors import InvalidArgument
from runifold_sync.model import validate


def _refused(check: Any, value: object, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InvalidArgument) as info:
        check("the_field", value, *args, **kwargs)
    message = str(info.value)
    assert message.startswith("the_field "), message
    return message


def test_shown_is_bounded_for_long_deep_and_huge_values() -> None:
    assert len(validate.shown("x" * 10_000)) < 200
    deep: list[Any] = []
    for _ in range(1000):
        deep = [deep]
    assert len(validate.shown(deep)) < 200
    assert validate.shown(2**5000) == "an integer of 5001 bits"
    assert validate.shown(5) == "5"


def test_shown_survives_a_repr_that_raises() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert "Hostile" in validate.shown(Hostile())


@pytest.mark.parametrize(
    ("check", "value", "kwargs"),
    [
        (validate.name, 5, {}),
        (validate.name, "", {}),
        (validate.name, " x", {}),
        (validate.name, "a\nb", {}),
        (validate.name, "x" * 201, {}),
        (validate.name, "\udcff", {}),
        (validate.text, "a\x00b", {}),
        (validate.text, "\udcff", {}),
        (validate.flag, 1, {}),
        (validate.integer, True, {}),
        (validate.integer, 1.0, {}),
        (validate.integer, 0, {"minimum": 1}),
        (validate.integer, 10, {"maximum": 9}),
        (validate.stored_int, 2**63, {}),
        (validate.count, 0, {}),
        (validate.number, float("nan"), {}),
        (validate.number, float("inf"), {}),
        (validate.number, 0, {}),
        (validate.duration, 5, {}),
        (validate.duration, timedelta(seconds=-1), {}),
        (validate.duration, timedelta(days=3651), {}),
        (validate.positive_duration, timedelta(0), {}),
        (validate.any_duration, timedelta(days=-3651), {}),
        (validate.seconds, -1, {}),
        (validate.seconds, float("nan"), {}),
        (validate.seconds, True, {}),
        (validate.moment, datetime(2030, 1, 1), {}),
        (validate.moment, "2030-01-01", {}),
        (validate.moment, datetime.max.replace(tzinfo=UTC), {}),
        (validate.json_text, object(), {"limit": 100}),
        (validate.json_text, float("nan"), {"limit": 100}),
        (validate.json_text, "x" * 200, {"limit": 100}),
        (validate.names, "net", {}),
        (validate.names, 5, {}),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(check: Any, value: object, kwargs: dict[str, Any]) -> None:
    assert validate.shown(value)[:20] in _refused(check, value, **kwargs) or check is validate.json_text


@pytest.mark.parametrize(
    ("check", "value"),
    [(validate.name, 5), (validate.integer, "7"), (validate.duration, 30), (validate.moment, "noon")],
)
def test_every_message_shows_the_bad_value_the_same_way(check: Any, value: object) -> None:
    assert _refused(check, value).endswith(f", got {validate.shown(value)}")


def test_names_checks_each_name_under_its_kind() -> None:
    with pytest.raises(InvalidArgument, match="^signal name must be non-empty"):
        validate.names("signals", ["ok", ""], kind="signal name")


def test_good_values_come_back_as_given_or_as_kept() -> None:
    assert validate.name("f", "orders") == "orders"
    assert validate.names("f", ["a", "b", "a"]) == frozenset({"a", "b"})
    assert validate.integer("f", 5, minimum=5, maximum=5) == 5
    assert validate.stored_int("f", -(2**63)) == -(2**63)
    assert validate.duration("f", timedelta(0)) == timedelta(0)
    assert validate.duration("f", timedelta(days=3650)) == timedelta(days=3650)
    assert validate.any_duration("f", timedelta(days=-1)) == timedelta(days=-1)
    assert validate.seconds("f", 1.5) == timedelta(seconds=1.5)
    moment = datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert validate.moment("f", moment) is moment
    assert validate.json_text("f", {"b": 1, "a": [1, 2]}, limit=100) == '{"a":[1,2],"b":1}'
    assert validate.cost("f", 1.5, 1.0) == 2.5


def test_json_text_refuses_past_its_limit_in_encoded_bytes() -> None:
    assert validate.json_text("f", "x" * 20, limit=22) == '"' + "x" * 20 + '"'
    with pytest.raises(InvalidArgument, match=r"^f is 23 bytes encoded, over the limit of 22"):
        validate.json_text("f", "x" * 21, limit=22)


def test_canonical_json_takes_only_the_text_json_text_makes() -> None:
    text = validate.json_text("f", {"b": 1, "a": ["\u00e9"]}, limit=100)
    assert text == '{"a":["\\u00e9"],"b":1}'
    assert validate.canonical_json("f", text, limit=100) is text
    assert _refused(validate.canonical_json, 5, limit=100) == "the_field must be a string, got 5"
    assert re.fullmatch(
        r"the_field must be JSON text \(.+\), got '\{'", _refused(validate.canonical_json, "{", limit=100)
    )
    # The same values written another way: spaces, key order, a raw non-ASCII letter, a
    # float's exponent, surrounding blanks.
    for other_form in ('{"a": 1}', '{"b":1,"a":2}', '"\u00e9"', "1e2", " 1"):
        message = _refused(validate.canonical_json, other_form, limit=100)
        assert message.startswith("the_field must be canonical JSON text"), message
        assert message.endswith(f"got {other_form!r}"), message
    assert "the_field is not JSON-serializable" in _refused(validate.canonical_json, "NaN", limit=100)
    assert "over the limit of 4" in _refused(validate.canonical_json, '"abcd"', limit=4)


def test_integer_bounds_are_said_in_the_message() -> None:
    assert re.search(
        r"must be an integer in 1\.\.9, got 10$", _refused(validate.integer, 10, minimum=1, maximum=9)
    )
    assert "must be an integer >= 1, got 0" in _refused(validate.count, 0)


def test_optional_and_bounded_by_compose() -> None:
    maybe_count = validate.optional(validate.count)
    assert maybe_count("f", None) is None
    assert maybe_count("f", 3) == 3
    with pytest.raises(InvalidArgument, match="^f must be an integer >= 1, got 0$"):
        maybe_count("f", 0)
    small = validate.bounded_by(validate.integer, minimum=1, maximum=3)
    with pytest.raises(InvalidArgument, match=r"^f must be an integer in 1\.\.3, got 4$"):
        small("f", 4)


@attrs.frozen
class _Thing:
    size: int = validate.field(validate.count, 1)
    label: str = validate.field(validate.name, "x", name="thing label")
    limit: timedelta | None = validate.field(validate.optional(validate.positive_duration), None, prefix=True)


def test_a_field_checks_where_the_object_is_made_and_by_evolve() -> None:
    assert _Thing().size == 1
    with pytest.raises(InvalidArgument, match="^size must be an integer >= 1, got 0$"):
        _Thing(size=0)
    with pytest.raises(InvalidArgument, match="^thing label must be a string, got 5$"):
        attrs.evolve(_Thing(), label=5)
    with pytest.raises(InvalidArgument, match=r"^_Thing\.limit must be positive"):
        _Thing(limit=timedelta(0))
    assert attrs.fields(_Thing).size.metadata["check"] is validate.count


def test_matching_takes_a_whole_match_only_and_says_the_alphabet() -> None:
    ident = validate.matching(r"[a-z]{1,3}", "1-3 lowercase letters")
    assert ident("id", "abc") == "abc"
    for bad in ("abcd", "ab1", "", 5, "abc\n"):
        with pytest.raises(InvalidArgument, match=r"^id must be 1-3 lowercase letters, got "):
            ident("id", bad)
