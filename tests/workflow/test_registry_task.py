"""``WorkflowRegistry.task``: a task checked where it is made (issue 19, findings 3 and 4).

A name or version the registry lacks is refused naming those it has, and input that does
not fit the main function's annotation is refused naming each wrong field with its path;
"7" is not an integer unless the definition asks for coercion.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import attrs
import pytest

from runifold_sync import Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry, WorkflowTask
from runifold_sync.errors import InputMismatch, InvalidArgument, UnknownDefinition


@attrs.frozen
class Line:
    sku: str
    qty: int


@attrs.frozen
class Invoice:
    invoice_id: int
    lines: list[Line]
    note: str | None = None


@dataclasses.dataclass
class Refund:
    invoice_id: int
    amount: float
    reasons: tuple[str, ...] = ()


def _workflow(name: str, version: int, signals: tuple[str, ...] = ()) -> Workflow:
    wf = Workflow(name, version, signals=signals)

    @wf.main
    def main(ctx: WorkflowContext, invoice: Invoice) -> int:
        return invoice.invoice_id

    return wf


def _refunds() -> Workflow:
    wf = Workflow("refund", 1)

    @wf.main
    def main(ctx: WorkflowContext, refund: Refund) -> float:
        return refund.amount

    return wf


def _registry(*, coerce_input: bool = False) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_workflow("invoice", 1, ("approval",)), coerce_input=coerce_input))
    registry.register(WorkflowDefinition(_workflow("invoice", 2)))
    registry.register(WorkflowDefinition(_refunds()))
    return registry


GOOD = {"invoice_id": 7, "lines": [{"sku": "a-1", "qty": 2}]}


def test_a_task_that_fits_is_the_task_new_makes_and_carries_its_declared_signals() -> None:
    task = _registry().task("invoice", 1, GOOD, checkpoint_id="inv-7", tenant="acme")

    assert task == WorkflowTask.new("invoice", 1, GOOD, checkpoint_id="inv-7", tenant="acme")
    assert task.declared is not None
    assert (task.declared.definition.name, task.declared.definition.version) == ("invoice", 1)
    assert task.declared.names == frozenset({"approval"})
    # an instance of the annotated class is taken as its JSON form
    instance = _registry().task("invoice", 1, Invoice(7, [Line("a-1", 2)]))
    assert json.loads(instance.input_json) == {**GOOD, "note": None}


def test_a_string_for_an_integer_field_is_refused_naming_its_path_and_what_it_got() -> None:
    with pytest.raises(InputMismatch) as refused:
        _registry().task("invoice", 1, {"invoice_id": "7", "lines": []})

    assert isinstance(refused.value, InvalidArgument) and isinstance(refused.value, ValueError)
    assert refused.value.problems == ("input.invoice_id: expected an integer, got the string '7'",)
    assert str(refused.value) == (
        "input of 'invoice' version 1 does not fit tests.workflow.test_registry_task.Invoice: "
        "input.invoice_id: expected an integer, got the string '7'"
    )


def test_every_wrong_field_is_listed_with_its_path_nested_ones_too() -> None:
    bad = {"lines": [{"sku": 1, "qty": "2"}, {"sku": "b"}, "c"], "note": 5, "notes": "x"}

    with pytest.raises(InputMismatch) as refused:
        _registry().task("invoice", 1, bad)

    assert refused.value.problems == (
        "input.invoice_id: required field missing",
        "input.lines[0].sku: expected a string, got the number 1",
        "input.lines[0].qty: expected an integer, got the string '2'",
        "input.lines[1].qty: required field missing",
        "input.lines[2]: expected an object for Line, got the string 'c'",
        "input.note: expected a string, got the number 5",
        "input: extra fields found (notes)",
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({**GOOD, "notes": "misspelt"}, "input: extra fields found (notes)"),
        ({**GOOD, "lines": "abc"}, "input.lines: expected an array, got the string 'abc'"),
        ({**GOOD, "invoice_id": True}, "input.invoice_id: expected an integer, got true"),
        ({**GOOD, "invoice_id": 7.5}, "input.invoice_id: expected an integer, got the number 7.5"),
        ([GOOD], "input: expected an object for Invoice, got an array of 1"),
    ],
)
def test_nothing_is_coerced_or_dropped_silently(value: Any, problem: str) -> None:
    with pytest.raises(InputMismatch) as refused:
        _registry().task("invoice", 1, value)
    assert refused.value.problems == (problem,)


def test_dataclass_inputs_are_checked_the_same_and_an_integer_is_a_number() -> None:
    registry = _registry()
    assert registry.task("refund", 1, {"invoice_id": 7, "amount": 5}).definition_name == "refund"
    with pytest.raises(InputMismatch) as refused:
        registry.task("refund", 1, {"invoice_id": 7, "amount": "5", "reasons": ["late", 3]})
    assert sorted(refused.value.problems) == [
        "input.amount: expected a number, got the string '5'",
        "input.reasons[1]: expected a string, got the number 3",
    ]


def test_a_definition_that_asks_for_coercion_gets_cattrs_conversions() -> None:
    registry = _registry(coerce_input=True)

    task = registry.task("invoice", 1, {"invoice_id": "7", "lines": []})

    assert json.loads(task.input_json) == {"invoice_id": "7", "lines": []}  # as given; converted when run
    with pytest.raises(InputMismatch, match=r"input\.invoice_id: invalid value for type, expected int"):
        registry.task("invoice", 1, {"invoice_id": "seven", "lines": []})


def test_an_unknown_name_is_refused_naming_the_registered_ones_and_the_closest() -> None:
    with pytest.raises(UnknownDefinition) as refused:
        _registry().task("invoyce", 1, GOOD)

    assert str(refused.value) == (
        "no workflow named 'invoyce' is registered; this registry has 'invoice' (versions 1, 2); "
        "'refund' (version 1). Did you mean 'invoice'?"
    )
    assert refused.value.registered == {"invoice": [1, 2], "refund": [1]}
    assert isinstance(refused.value, InvalidArgument)


def test_an_unknown_version_is_refused_naming_the_registered_versions() -> None:
    with pytest.raises(
        UnknownDefinition, match=r"^'invoice' has no version 3 in this registry, only versions 1, 2$"
    ):
        _registry().task("invoice", 3, GOOD)
    with pytest.raises(UnknownDefinition, match="this registry has no definitions"):
        WorkflowRegistry().task("invoice", 1, GOOD)


def test_bad_arguments_are_refused_before_the_registry_is_asked() -> None:
    with pytest.raises(InvalidArgument, match="version must be an integer in 1.."):
        _registry().task("invoice", 0, GOOD)
    with pytest.raises(InvalidArgument, match="is not JSON-serializable"):
        _registry().task("invoice", 1, object())


def test_coerce_input_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgument, match="coerce_input must be True or False, got 'yes'"):
        WorkflowDefinition(_refunds(), coerce_input="yes")  # type: ignore[arg-type]
