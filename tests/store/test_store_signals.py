"""Signals and cancellation in the store contract, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import (
    InvalidArgument,
    InvalidState,
    LeaseLostError,
    SignalConflict,
    SignalRefused,
    TaskNotFound,
)
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskState
from runifold_sync.store.checks import MAX_PENDING_SIGNALS
from runifold_sync.store.records import ClaimedTask
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
FAR = timedelta(days=1)
OK = {"ok": True}


def _task(store: WorkflowStore, task_id: str = "t1", tenant: str = "acme") -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id=task_id, tenant=tenant))


def _claim(store: WorkflowStore) -> ClaimedTask:
    (claimed,) = store.claim(W1, LEASE)
    return claimed


def _send(store: WorkflowStore, signal_id: str = "s1", payload: Any = OK, **kw: str) -> bool:
    options = {"sender": "alice", "tenant": "acme"} | kw
    return store.send_signal("t1", "approval", payload, signal_id=signal_id, **options).created


def _wait_for_signal(store: WorkflowStore, claimed: ClaimedTask, wake_at_offset: timedelta = FAR) -> None:
    store.suspend(
        claimed.lease,
        claimed.revision,
        "{}",
        wake_at=store.now() + wake_at_offset,
        reason="waiting for signal approval",
        signal="approval",
    )


def test_a_signal_sent_twice_with_one_id_is_kept_once(store: WorkflowStore) -> None:
    _task(store)
    assert _send(store) is True
    assert _send(store) is False
    assert [s.signal_id for s in store.pending_signals("t1", "approval")] == ["s1"]
    assert [e.kind for e in store.history("t1")].count("signal_received") == 1


def test_the_same_signal_id_with_another_payload_is_a_conflict(store: WorkflowStore) -> None:
    _task(store)
    _send(store)
    with pytest.raises(SignalConflict, match="'s1' was already delivered"):
        _send(store, payload={"ok": False})


def test_a_waiting_task_wakes_when_its_signal_arrives(store: WorkflowStore) -> None:
    _task(store)
    _wait_for_signal(store, _claim(store))
    assert store.claim(W1, LEASE) == []
    _send(store)
    claimed = _claim(store)
    assert claimed.lease.task_id == "t1"
    (signal,) = store.pending_signals("t1", "approval")
    assert (signal.payload_json, signal.sender) == ('{"ok":true}', "alice")


def test_a_resumed_task_reports_how_long_and_on_what_it_waited(store: WorkflowStore) -> None:
    _task(store)
    _wait_for_signal(store, _claim(store))
    suspended_at = store.get_task("t1").updated_at
    store.set_clock_offset(timedelta(minutes=10))
    _send(store)
    claimed = _claim(store)
    assert (claimed.from_state, claimed.wait_kind, claimed.wait_started_at) == (
        "waiting",
        "signal",
        suspended_at,
    )
    store.suspend(claimed.lease, claimed.revision, "{}", wake_at=store.now(), reason="timer")
    timer_set_at = store.get_task("t1").updated_at
    resumed = _claim(store)
    assert (resumed.wait_kind, resumed.wait_started_at) == ("timer", timer_set_at)
    assert resumed.claimed_at >= timer_set_at


def test_pending_signals_without_a_name_lists_every_unconsumed_one_oldest_first(
    store: WorkflowStore,
) -> None:
    _task(store)
    for signal_id, name in (("s1", "approval"), ("s2", "typo"), ("s3", "approval")):
        store.send_signal("t1", name, None, signal_id=signal_id, sender="alice", tenant="acme")
    claimed = _claim(store)
    store.consume_signal(claimed.lease, claimed.revision, "{}", "s1", accepted=True, note="taken")

    pending = store.pending_signals("t1")

    assert [(s.signal_id, s.name) for s in pending] == [("s2", "typo"), ("s3", "approval")]
    assert [s.signal_id for s in store.pending_signals("t1", "approval")] == ["s3"]


def test_a_signal_of_another_name_does_not_wake_the_task(store: WorkflowStore) -> None:
    _task(store)
    _wait_for_signal(store, _claim(store))
    store.send_signal("t1", "other", None, signal_id="x", sender="alice", tenant="acme")
    assert store.claim(W1, LEASE) == []


def test_a_signal_pending_before_the_wait_makes_the_suspension_wake_at_once(store: WorkflowStore) -> None:
    _task(store)
    claimed = _claim(store)
    _send(store)  # arrives while the worker runs, before it decides to wait
    _wait_for_signal(store, claimed)
    assert _claim(store).lease.task_id == "t1"


def test_a_signal_from_another_tenant_is_answered_as_for_no_such_task_and_recorded(
    store: WorkflowStore,
) -> None:
    _task(store)
    with pytest.raises(TaskNotFound) as foreign:
        _send(store, tenant="globex", sender="mallory")
    with pytest.raises(TaskNotFound) as missing:
        store.send_signal("t0", "approval", OK, signal_id="s1", sender="mallory", tenant="globex")
    assert (str(foreign.value), str(missing.value)) == ("no task with id 't1'", "no task with id 't0'")
    assert store.pending_signals("t1", "approval") == []
    refused = store.history("t1")[-1]  # operators still see who tried, and why it failed
    assert refused.kind == "signal_refused"
    assert (refused.detail["sender"], refused.detail["signal_id"]) == ("mallory", "s1")
    assert refused.detail["refused"] == "sender's tenant 'globex' is not the task's tenant 'acme'"


def test_signals_to_finished_or_missing_tasks_are_refused(store: WorkflowStore) -> None:
    with pytest.raises(TaskNotFound):
        _send(store)
    _task(store)
    store.cancel("t1", actor="ops", reason="not needed")
    with pytest.raises(SignalRefused, match="the task is cancelled"):
        _send(store)


@pytest.mark.parametrize("where", ["leased", "waiting with compensations to run"])
def test_a_signal_to_a_task_being_cancelled_is_refused_and_recorded(store: WorkflowStore, where: str) -> None:
    _task(store)
    claimed = _claim(store)
    if where == "leased":
        answer = TaskState.LEASED
    else:
        undo = to_json({"undo": ["reserve#1"]})
        store.suspend(claimed.lease, claimed.revision, undo, wake_at=None, reason="wait")
        answer = TaskState.QUEUED  # handed to a worker that runs the compensation
    assert store.cancel("t1", actor="ops", reason="customer left") is answer

    with pytest.raises(SignalRefused, match="the task is being cancelled"):
        _send(store)

    assert store.pending_signals("t1", "approval") == []
    refused = store.history("t1")[-1]
    assert (refused.kind, refused.detail) == (
        "signal_refused",
        {
            "signal_id": "s1",
            "name": "approval",
            "sender": "alice",
            "reason": None,
            "refused": "the task is being cancelled",
        },
    )


def test_pending_signals_are_capped_per_task(store: WorkflowStore) -> None:
    _task(store)
    for n in range(MAX_PENDING_SIGNALS):
        _send(store, signal_id=f"s{n}")
    with pytest.raises(SignalRefused, match=f"limit {MAX_PENDING_SIGNALS}"):
        _send(store, signal_id="one-too-many")


def test_bad_signal_arguments_name_the_value(store: WorkflowStore) -> None:
    _task(store)
    with pytest.raises(InvalidArgument, match="signal id must be non-empty"):
        _send(store, signal_id="")
    with pytest.raises(InvalidArgument, match="sender contains control characters"):
        _send(store, sender="al\x00ice")


def test_consuming_a_signal_commits_the_checkpoint_and_records_the_decision(store: WorkflowStore) -> None:
    _task(store)
    _send(store, signal_id="forged", sender="mallory")
    _send(store, signal_id="real")
    claimed = _claim(store)
    revision = store.consume_signal(
        claimed.lease, claimed.revision, '{"a":1}', "forged", accepted=False, note="no"
    ).revision
    store.consume_signal(claimed.lease, revision, '{"a":2}', "real", accepted=True, note="approved")
    assert store.get_task("t1").checkpoint_json == '{"a":2}'
    assert store.pending_signals("t1", "approval") == []
    events = [(e.kind, e.detail.get("sender")) for e in store.history("t1")[-2:]]
    assert events == [("signal_refused", "mallory"), ("signal_consumed", "alice")]


def test_consuming_a_signal_with_a_stale_lease_is_refused(store: WorkflowStore) -> None:
    _task(store)
    _send(store)
    old = _claim(store)
    store.set_clock_offset(timedelta(seconds=31))
    _claim(store)
    with pytest.raises(LeaseLostError):
        store.consume_signal(old.lease, old.revision, "{}", "s1", accepted=True, note="late")
    assert len(store.pending_signals("t1", "approval")) == 1


def test_cancel_of_a_queued_or_waiting_task_is_immediate(store: WorkflowStore) -> None:
    _task(store, "t1")
    _task(store, "t2")
    assert store.cancel("t1", actor="ops", reason="duplicate") is TaskState.CANCELLED
    claimed = _claim(store)
    _wait_for_signal(store, claimed)
    assert store.cancel("t2", actor="ops", reason="gone") is TaskState.CANCELLED
    for task_id in ("t1", "t2"):
        record = store.get_task(task_id)
        assert record.state is TaskState.CANCELLED and record.reason is not None and "ops" in record.reason
    assert store.history("t1")[-1].detail == {"actor": "ops", "reason": "duplicate"}
    assert store.claim(W1, LEASE) == []


def test_cancel_of_a_leased_task_is_seen_by_the_next_heartbeat_and_acknowledged(store: WorkflowStore) -> None:
    _task(store)
    claimed = _claim(store)
    assert store.heartbeat(claimed.lease, LEASE).cancel_requested is None
    assert store.cancel("t1", actor="ops", reason="customer left") is TaskState.LEASED
    assert store.get_task("t1").state is TaskState.LEASED
    beat = store.heartbeat(claimed.lease, LEASE)
    assert beat.cancel_requested == "cancelled by ops: customer left"
    store.acknowledge_cancel(claimed.lease, claimed.revision, '{"stopped":true}')
    record = store.get_task("t1")
    assert (record.state, record.reason) == (TaskState.CANCELLED, "cancelled by ops: customer left")
    assert [e.kind for e in store.history("t1")][-2:] == ["cancel_requested", "cancelled"]


def test_finished_tasks_cannot_be_cancelled(store: WorkflowStore) -> None:
    _task(store)
    claimed = _claim(store)
    store.complete(claimed.lease, claimed.revision, "{}", "null")
    with pytest.raises(InvalidState, match="only an unfinished task can be cancelled"):
        store.cancel("t1", actor="ops", reason="late")
