"""The codec's fast paths give what the slow ones give: ``from_json`` reads every text as
``json.loads`` does, ``canonical_text`` writes every value as
``CANONICAL_ENCODER.encode``, and a scalar fits its annotation as the converters fit it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runifold_sync.model.codec import CANONICAL_ENCODER, c_encoder, canonical_text, from_json, to_json
from runifold_sync.model.inputs import fit_input, fit_output, strict

# Text every store keeps (no U+0000, no lone surrogate), which to_json accepts.
texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda children: st.lists(children) | st.dictionaries(texts, children),
    max_leaves=20,
)


def _read(read: Any, text: Any) -> tuple[str, Any]:
    try:
        return "value", read(text)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@settings(deadline=None)  # a shared machine's pauses are no failure
@given(json_values, st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\n"]))
def test_from_json_reads_text_as_json_loads_does(value: Any, before: str, after: str) -> None:
    text = before + json.dumps(value) + after
    assert from_json(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    ["", " ", "[1,", "1 2", "\ufeff1", "nul", '"\\ud800', "NaN", "-Infinity", b"[1]", bytearray(b"2"), 3],
)
def test_from_json_accepts_and_refuses_what_json_loads_does(text: Any) -> None:
    found, expected = _read(from_json, text), _read(json.loads, text)
    if found[0] == "value" and isinstance(found[1], float) and found[1] != found[1]:
        assert expected[0] == "value" and expected[1] != expected[1]  # NaN
    else:
        assert found == expected


@settings(deadline=None)  # a shared machine's pauses are no failure
@given(json_values)
def test_canonical_text_reads_back_equal(value: Any) -> None:
    assert from_json(to_json(value)) == value


def _written(write: Any, value: Any) -> tuple[str, Any]:
    try:
        return "text", write(value)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@settings(deadline=None)  # a shared machine's pauses are no failure
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda children: (
            st.lists(children) | st.tuples(children) | st.dictionaries(st.text() | st.integers(), children)
        ),
        max_leaves=20,
    )
)
def test_canonical_text_writes_what_the_canonical_encoder_writes(value: Any) -> None:
    assert _written(canonical_text, value) == _written(CANONICAL_ENCODER.encode, value)


def test_canonical_text_refuses_what_the_canonical_encoder_refuses() -> None:
    circular: list[Any] = []
    circular.append(circular)
    for value in (object(), {1j: 2}, float("nan"), circular, {1, 2}):
        assert _written(canonical_text, value) == _written(CANONICAL_ENCODER.encode, value)
    assert _written(canonical_text, circular)[0] == "ValueError"  # the circular check kept


@pytest.mark.parametrize("value", ["a", 5, 2.5, -0.0, True, False, None, 10**30])
def test_a_scalar_of_its_annotation_fits_as_the_converters_fit_it(value: Any) -> None:
    annotation = type(value)
    assert fit_output(value, annotation) == strict.structure(value, annotation)
    assert type(fit_output(value, annotation)) is annotation
    for coerce in (False, True):
        assert fit_input(value, annotation, coerce=coerce) == value
        assert type(fit_input(value, annotation, coerce=coerce)) is annotation


@pytest.mark.parametrize(
    "encoder",
    [
        json.JSONEncoder(sort_keys=True),
        json.JSONEncoder(ensure_ascii=False, check_circular=False),
        json.JSONEncoder(separators=(",", ":"), skipkeys=True),
    ],
)
@settings(deadline=None)  # a shared machine's pauses are no failure
@given(value=json_values)
def test_c_encoder_writes_what_its_encoder_writes(encoder: json.JSONEncoder, value: Any) -> None:
    assert c_encoder(encoder)(value) == encoder.encode(value)


def test_c_encoder_leaves_an_indenting_encoder_as_it_is() -> None:
    encoder = json.JSONEncoder(indent=2)
    assert c_encoder(encoder) == encoder.encode
