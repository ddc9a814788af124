"""Declaring step and effect timeouts: what ``timeout=`` accepts, and why it is no part
of a definition's fingerprint."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import StepContext, Workflow, WorkflowContext
from runifold_sync.engine.deadlines import RunningBodies, describe_timeout
from runifold_sync.errors import InvalidArgument


def _flow(step_timeout: timedelta | None, effect_timeout: timedelta | None) -> Workflow:
    flow = Workflow("timed", 1)

    @flow.step(timeout=step_timeout)
    def fetch(ctx: StepContext, n: int) -> int:
        return n

    @flow.effect(idempotent=True, timeout=effect_timeout)
    def store(ctx: StepContext, n: int) -> int:
        return n

    @flow.main
    def main(ctx: WorkflowContext, n: int) -> int:
        return store(ctx, fetch(ctx, n))

    return flow


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (timedelta(seconds=-1), "timeout must be positive, got datetime.timedelta(days=-1, seconds=86399)"),
        (timedelta(0), "timeout must be positive, got datetime.timedelta(0)"),
        (1, "timeout must be a datetime.timedelta, got 1"),
        (1.5, "timeout must be a datetime.timedelta, got 1.5"),
        ("1s", "timeout must be a datetime.timedelta, got '1s'"),
        (True, "timeout must be a datetime.timedelta, got True"),
        (timedelta(days=3651), "timeout must be at most 3650 days, got datetime.timedelta(days=3651)"),
    ],
)
@pytest.mark.parametrize("kind", ["step", "effect"])
def test_a_bad_timeout_is_refused_where_the_step_is_declared(kind: str, value: object, message: str) -> None:
    flow = Workflow("bad", 1)
    with pytest.raises(InvalidArgument) as refused:
        if kind == "step":
            flow.step(timeout=value)  # type: ignore[arg-type]
        else:
            flow.effect(idempotent=True, timeout=value)  # type: ignore[arg-type]
    assert str(refused.value) == message
    assert flow.steps == {}


def test_a_timeout_is_kept_on_the_declared_step() -> None:
    flow = _flow(timedelta(seconds=2), timedelta(minutes=1))
    assert flow.steps["fetch"].timeout == timedelta(seconds=2)
    assert flow.steps["store"].timeout == timedelta(minutes=1)
    assert _flow(None, None).steps["fetch"].timeout is None


def test_a_timeout_is_no_part_of_the_fingerprint() -> None:
    """Like the retry policy, a timeout says how long one attempt may run, not what the
    checkpoint means: changing it needs no new version, and tasks checkpointed under the
    old value go on under the new one."""
    untimed = _flow(None, None).fingerprint()
    assert _flow(timedelta(seconds=1), None).fingerprint() == untimed
    assert _flow(timedelta(seconds=5), timedelta(hours=1)).fingerprint() == untimed


def test_timeouts_are_named_as_reasons_write_them() -> None:
    assert [describe_timeout(s) for s in (1, 0.25, 90, 1.5, 0.3, 3600)] == [
        "1s",
        "0.25s",
        "90s",
        "1.5s",
        "0.3s",
        "3600s",
    ]


def test_running_bodies_tell_the_earliest_deadline_and_which_body_is_overdue() -> None:
    heard: list[float | None] = []
    bodies = RunningBodies(heard.append)
    bodies.begin("a#1", 60.0)
    bodies.begin("b#1", 0.0)  # overdue at once
    assert bodies.overdue() == ("b#1", 0.0)
    assert bodies.end("b#1") is True
    assert bodies.overdue() is None
    assert bodies.end("a#1") is False
    assert len(heard) == 4 and heard[-1] is None
    assert heard[1] is not None and heard[0] is not None and heard[1] < heard[0]
    assert heard[2] == heard[0]
