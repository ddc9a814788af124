"""Authoring: step ids, fingerprints, the registry and definition checks."""

from __future__ import annotations

import re
from typing import Any

import pytest

from runifold_sync import (
    Budget,
    CapabilitySet,
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)
from runifold_sync.errors import DefinitionConflict, InvalidArgument


def build(
    name: str = "orders",
    version: int = 1,
    *,
    extra_step: bool = False,
    idempotent: bool = False,
    retry: RetryPolicy | None = None,
) -> Workflow:
    """A fresh Workflow object; two calls with the same arguments declare the same graph."""
    wf = Workflow(name, version)

    @wf.step(retry=retry)
    def reserve(ctx: StepContext, order_id: str) -> str:
        return order_id

    @wf.effect("charge", idempotent=idempotent)
    def charge_card(ctx: StepContext, order_id: str) -> str:
        return order_id

    if extra_step:

        @wf.step()
        def notify(ctx: StepContext) -> None:
            return None

    @wf.main
    def main(ctx: WorkflowContext, order: dict[str, Any]) -> str:
        return charge_card(ctx, reserve(ctx, order["id"]))

    return wf


# --- step ids -----------------------------------------------------------------------------


def test_default_step_id_is_the_function_name() -> None:
    assert "reserve" in build().steps
    assert build().steps["reserve"].kind == "step"


def test_explicit_step_id_replaces_the_function_name() -> None:
    steps = build().steps
    assert "charge" in steps
    assert "charge_card" not in steps
    assert steps["charge"].kind == "effect"


def test_duplicate_step_id_is_refused_naming_it() -> None:
    wf = Workflow("orders", 1)

    @wf.step("reserve")
    def first(ctx: StepContext) -> None: ...

    with pytest.raises(InvalidArgument, match="'reserve'"):

        @wf.step("reserve")
        def second(ctx: StepContext) -> None: ...

    with pytest.raises(InvalidArgument, match="'reserve'"):

        @wf.effect("reserve", idempotent=True)
        def third(ctx: StepContext) -> None: ...


def test_decorated_step_keeps_the_function_name() -> None:
    wf = Workflow("orders", 1)

    @wf.step("reserve")
    def reserve_stock(ctx: StepContext) -> None: ...

    assert reserve_stock.__name__ == "reserve_stock"


# --- fingerprints ---------------------------------------------------------------------------


def test_fingerprint_is_stable_across_identical_workflow_objects() -> None:
    first, second = build(), build()
    assert first is not second
    assert first.fingerprint() == second.fingerprint()


def test_fingerprint_changes_when_a_step_is_added() -> None:
    assert build().fingerprint() != build(extra_step=True).fingerprint()


def test_fingerprint_asked_early_still_changes_with_later_declarations() -> None:
    workflow = Workflow("late", 1)
    before = workflow.fingerprint()

    @workflow.step()
    def added(ctx: StepContext) -> int:
        return 1

    with_step = workflow.fingerprint()
    assert with_step != before

    @workflow.compensate_for("added")
    def undo(ctx: StepContext, output: int) -> None:
        pass

    assert workflow.fingerprint() not in (before, with_step)


def test_fingerprint_changes_when_an_effect_idempotent_flag_changes() -> None:
    assert build(idempotent=False).fingerprint() != build(idempotent=True).fingerprint()


def test_fingerprint_differs_between_versions() -> None:
    assert build(version=1).fingerprint() != build(version=2).fingerprint()


@pytest.mark.parametrize(
    "retry",
    [
        None,
        RetryPolicy(),
        RetryPolicy(non_retryable=()),
        RetryPolicy(max_attempts=9, non_retryable=(ValueError, *RetryPolicy.PROGRAMMING_ERRORS)),
    ],
)
def test_fingerprint_ignores_the_retry_policy_so_existing_checkpoints_still_match(
    retry: RetryPolicy | None,
) -> None:
    # A retry policy says how often a step runs, not what its checkpoint entries mean, so
    # it is no part of the fingerprint: this value is what the code before
    # RetryPolicy.non_retryable computed, and tasks checkpointed by it continue.
    assert build(retry=retry).fingerprint() == "85ff52fde63a89b7"


# --- registry -------------------------------------------------------------------------------


def test_same_name_and_version_with_another_fingerprint_is_a_definition_conflict() -> None:
    registry = WorkflowRegistry()
    original = WorkflowDefinition(build())
    registry.register(original)
    changed = WorkflowDefinition(build(extra_step=True))
    with pytest.raises(DefinitionConflict) as info:
        registry.register(changed)
    assert isinstance(info.value, ValueError)
    assert original.identity.fingerprint in str(info.value)
    assert changed.identity.fingerprint in str(info.value)
    assert registry.get("orders", 1) is original


def test_registering_the_same_fingerprint_again_is_accepted() -> None:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(build()))
    again = WorkflowDefinition(build())
    registry.register(again)
    assert len(registry) == 1
    assert registry.get("orders", 1) is again


def test_registry_get_returns_the_exact_version_only() -> None:
    registry = WorkflowRegistry()
    v1, v2 = WorkflowDefinition(build(version=1)), WorkflowDefinition(build(version=2))
    registry.register(v1)
    registry.register(v2)
    assert registry.get("orders", 1) is v1
    assert registry.get("orders", 2) is v2
    assert registry.get("orders", 3) is None
    assert registry.get("other", 1) is None


# --- definitions ----------------------------------------------------------------------------


def _needs_network() -> Workflow:
    wf = Workflow("fetcher", 1)

    @wf.step(capabilities=["network"])
    def fetch(ctx: StepContext) -> str:
        return "page"

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return fetch(ctx)

    return wf


def test_definition_refuses_a_step_whose_capability_is_not_granted() -> None:
    with pytest.raises(InvalidArgument) as info:
        WorkflowDefinition(_needs_network(), capabilities=CapabilitySet(["filesystem"]))
    assert "'fetch'" in str(info.value)
    assert "network" in str(info.value)


def test_definition_accepts_a_step_whose_capability_is_granted() -> None:
    definition = WorkflowDefinition(_needs_network(), capabilities=CapabilitySet(["network"]))
    assert definition.identity.name == "fetcher"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("budget", "x", "must be a Budget"),
        ("budget", None, "must be a Budget"),
        ("capabilities", "net", "must be a CapabilitySet"),
        ("capabilities", ["network"], "must be a CapabilitySet"),
        ("capabilities", frozenset({"network"}), "must be a CapabilitySet"),
        ("sender_policy", 5, "must be None or a callable"),
        ("sender_policy", "ops", "must be None or a callable"),
    ],
)
def test_definition_field_of_the_wrong_type_is_refused_naming_field_and_value(
    field: str, value: Any, expected: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        WorkflowDefinition(build(), **{field: value})
    message = str(info.value)
    assert f"WorkflowDefinition.{field} {expected}" in message
    assert repr(value) in message


def test_definition_keeps_a_budget_capability_set_and_callable_sender_policy() -> None:
    def policy(sender: str, name: str, payload: Any) -> bool:
        return sender == "ops"

    definition = WorkflowDefinition(
        _needs_network(), Budget(max_steps=3), CapabilitySet(["network"]), sender_policy=policy
    )
    assert (definition.budget.max_steps, definition.sender_policy) == (3, policy)


@pytest.mark.parametrize("kind", ["step", "effect", "transaction"])
def test_capabilities_given_as_a_bare_string_are_refused_naming_it(kind: str) -> None:
    wf = Workflow("fetcher", 1)
    extra = {"idempotent": True} if kind == "effect" else {}
    refusal = r"capabilities must be an iterable of names, got the string 'net'; write \['net'\]"
    with pytest.raises(InvalidArgument, match=refusal):
        getattr(wf, kind)(capabilities="net", **extra)
    assert wf.steps == {}


def test_capabilities_given_as_a_list_of_names_are_kept() -> None:
    assert _needs_network().steps["fetch"].capabilities == frozenset({"network"})


def test_workflow_without_main_is_refused() -> None:
    wf = Workflow("headless", 1)

    @wf.step()
    def only(ctx: StepContext) -> None: ...

    with pytest.raises(InvalidArgument, match="no @main"):
        WorkflowDefinition(wf)


def test_second_main_is_refused() -> None:
    wf = build()
    with pytest.raises(InvalidArgument, match="already has a main"):
        wf.main(lambda ctx, value: value)


def test_calling_a_step_outside_a_workflow_raises_type_error_naming_it() -> None:
    wf = Workflow("orders", 1)

    @wf.step()
    def reserve(ctx: StepContext, order_id: str) -> str:
        return order_id

    with pytest.raises(TypeError, match="'reserve'"):
        reserve(None, "o1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'reserve'"):
        reserve(StepContext("t", "reserve#1", 1, 1, None), "o1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda wf: wf.step()(5), "@workflow.step() must decorate a function, got 5"),
        (lambda wf: wf.effect(idempotent=True)(5), "@workflow.effect() must decorate a function, got 5"),
        (lambda wf: wf.transaction()("f"), "@workflow.step() must decorate a function, got 'f'"),
        (lambda wf: wf.main(5), "@workflow.main must decorate a function, got 5"),
        (
            lambda wf: wf.compensate_for("s")(5),
            "@workflow.compensate_for('s') must decorate a function, got 5",
        ),
        (lambda wf: wf.step(capabilities=None), "capabilities must be an iterable of names, got None"),
        (lambda wf: wf.step(capabilities=[5]), "capability must be a string, got 5"),
        (lambda wf: Workflow("w", 1, signals=None), "signals must be an iterable of names, got None"),
        (lambda wf: Workflow("w", 1, signals=5), "signals must be an iterable of names, got 5"),
    ],
    ids=[
        "step",
        "effect",
        "transaction",
        "main",
        "compensate_for",
        "capabilities-none",
        "capability-number",
        "signals-none",
        "signals-number",
    ],
)
def test_a_declaration_of_the_wrong_shape_is_refused_where_it_is_written(declare: Any, message: str) -> None:
    # Before: accepted (a worker failed on it later), or a bare TypeError.
    wf = Workflow("shapes", 1)
    with pytest.raises(InvalidArgument, match=f"^{re.escape(message)}$"):
        declare(wf)
    assert (wf.steps, wf.compensations, wf.main_fn) == ({}, {}, None)
