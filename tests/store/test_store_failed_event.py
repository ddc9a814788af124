"""The ``failed`` event records what the worker found failed, on every backend: the
error's class, the step and the effect key, beside the reason (``show`` prints them)."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.outcomes import FailureDetail
from runifold_sync.store.records import ClaimedTask
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))


def _claim(store: WorkflowStore) -> ClaimedTask:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    (claimed,) = store.claim(WorkerId.parse("worker-1"), LEASE)
    return claimed


def test_the_failed_event_carries_the_structured_error(store: WorkflowStore) -> None:
    claimed = _claim(store)
    error = FailureDetail("ValueError", "card declined", "t1", "charge", "t1/charge#1")
    store.fail(claimed.lease, claimed.revision, None, reason="effect 'charge' raised", error=error)
    assert store.history("t1")[-1].detail == {
        "reason": "effect 'charge' raised",
        "error_class": "ValueError",
        "step_id": "charge",
        "effect_key": "t1/charge#1",
    }


def test_an_ambiguous_failure_keeps_its_key_beside_the_structured_error(store: WorkflowStore) -> None:
    claimed = _claim(store)
    error = FailureDetail("AmbiguousEffect", "unknown", "t1", "charge", "t1/charge#1")
    store.fail(
        claimed.lease, claimed.revision, None, reason="unknown", ambiguous_effect="t1/charge#1", error=error
    )
    assert store.history("t1")[-1].detail == {
        "reason": "unknown",
        "ambiguous_effect": "t1/charge#1",
        "error_class": "AmbiguousEffect",
        "step_id": "charge",
        "effect_key": "t1/charge#1",
    }
    assert store.get_task("t1").ambiguous_effect == "t1/charge#1"


def test_a_failure_without_an_error_class_records_none(store: WorkflowStore) -> None:
    claimed = _claim(store)
    error = FailureDetail(None, "budget max_steps=3 exceeded", "t1")
    store.fail(claimed.lease, claimed.revision, None, reason="budget max_steps=3 exceeded", error=error)
    assert store.history("t1")[-1].detail == {
        "reason": "budget max_steps=3 exceeded",
        "error_class": None,
        "step_id": None,
        "effect_key": None,
    }
