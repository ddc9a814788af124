"""Signal deliveries a waiting workflow must survive, on SQLite and PostgreSQL: payloads
it could not decode, a flood past the pending cap, forged senders and a sender policy
that raises. Each is refused and recorded where it arrives; the task keeps waiting and
completes on the signal it was waiting for."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.errors import InvalidArgument, SignalConflict, SignalRefused, TaskNotFound
from runifold_sync.model.codec import MAX_NESTING_DEPTH
from runifold_sync.outcomes import Completed, Idle, Suspended
from runifold_sync.store import TaskState
from runifold_sync.store.refusals import RECORDED_SIGNAL_REFUSALS
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
SenderPolicy = Callable[[str, str, Any], bool] | None


def _shipping() -> Workflow:
    wf = Workflow("shipping", 1, signals=["shipped"])

    @wf.main
    def main(ctx: WorkflowContext, order_id: str) -> dict[str, Any]:
        shipment = ctx.wait_for_signal("shipped")
        return {"order": order_id, "shipment": shipment}

    return wf


def _worker(store: WorkflowStore, policy: SenderPolicy = None) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_shipping(), sender_policy=policy))
    return WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=10))


def _waiting_task(store: WorkflowStore, worker: WorkflowWorker, tenant: str = "default") -> str:
    task_id = store.enqueue(WorkflowTask.new("shipping", 1, "o1", tenant=tenant)).task_id
    assert isinstance(worker.run_once(), Suspended)
    return task_id


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _kinds(store: WorkflowStore, task_id: str) -> list[str]:
    return [e.kind for e in store.history(task_id)]


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (object(), "payload of signal 'bad' is not JSON-serializable: TypeError"),
        ({"n": float("nan")}, "payload of signal 'bad' is not JSON-serializable: ValueError"),
        (_nested(100_000), f"payload of signal 'bad' nests deeper than {MAX_NESTING_DEPTH} levels"),
        (_nested(MAX_NESTING_DEPTH + 1), "nests deeper than"),
        ("x" * (5 << 20), r"payload of signal 'bad' is 5242882 bytes encoded, over the limit of 1048576"),
    ],
    ids=["object", "nan", "nested-100000", "nested-one-too-deep", "5-MiB"],
)
def test_a_payload_the_task_could_not_decode_is_refused_and_nothing_is_stored(
    store: WorkflowStore, payload: Any, problem: str
) -> None:
    worker = _worker(store)
    task_id = _waiting_task(store, worker)
    history = _kinds(store, task_id)

    with pytest.raises(InvalidArgument, match=problem):
        store.send_signal(task_id, "shipped", payload, signal_id="bad", sender="warehouse")

    assert store.pending_signals(task_id, "shipped") == []
    assert _kinds(store, task_id) == history
    assert store.get_task(task_id).state is TaskState.WAITING
    assert worker.run_once() == Idle()
    store.send_signal(task_id, "shipped", {"carrier": "dhl"}, signal_id="bad", sender="warehouse")
    assert worker.run_once() == Completed(task_id, {"order": "o1", "shipment": {"carrier": "dhl"}})


def test_a_resent_signal_id_compares_payloads_as_canonical_json(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("shipping", 1, "o1", checkpoint_id="t1"))
    first = {"carrier": "dhl", "tracking": "T1", "items": [1, 2]}

    assert store.send_signal("t1", "shipped", first, signal_id="s1", sender="warehouse").created
    same_in_another_order = {"items": [1, 2], "tracking": "T1", "carrier": "dhl"}
    again = store.send_signal("t1", "shipped", same_in_another_order, signal_id="s1", sender="warehouse")
    assert again.created is False
    with pytest.raises(SignalConflict, match="'s1' was already delivered to task 't1'"):
        store.send_signal("t1", "shipped", first | {"items": [2, 1]}, signal_id="s1", sender="warehouse")
    assert store.send_signal("t1", "shipped", {"n": 1}, signal_id="s2", sender="warehouse").created
    with pytest.raises(SignalConflict):  # 1 and 1.0 differ as JSON, as they do for inputs
        store.send_signal("t1", "shipped", {"n": 1.0}, signal_id="s2", sender="warehouse")
    (kept, _) = store.pending_signals("t1", "shipped")
    assert (kept.signal_id, kept.payload) == ("s1", first)


def test_a_sender_of_another_tenant_cannot_learn_whether_the_task_or_a_signal_id_exists(
    store: WorkflowStore,
) -> None:
    store.enqueue(WorkflowTask.new("shipping", 1, "o1", checkpoint_id="t1", tenant="acme"))
    store.send_signal("t1", "shipped", {"ok": True}, signal_id="s1", sender="warehouse", tenant="acme")

    answers = []
    # A taken signal id, a free one, and a task that does not exist: the same answer.
    for task_id, signal_id in (("t1", "s1"), ("t1", "never-sent"), ("no-such-task", "s1")):
        with pytest.raises(TaskNotFound) as refused:
            store.send_signal(
                task_id, "shipped", {"ok": False}, signal_id=signal_id, sender="mallory", tenant="globex"
            )
        answers.append((type(refused.value), str(refused.value).replace(repr(task_id), "<id>")))

    assert answers == [(TaskNotFound, "no task with id <id>")] * 3
    assert [s.signal_id for s in store.pending_signals("t1", "shipped")] == ["s1"]
    refused_events = [e.detail for e in store.history("t1") if e.kind == "signal_refused"]
    assert [(d["signal_id"], d["sender"], d["refused"]) for d in refused_events] == [
        ("s1", "mallory", "sender's tenant 'globex' is not the task's tenant 'acme'"),
        ("never-sent", "mallory", "sender's tenant 'globex' is not the task's tenant 'acme'"),
    ]


def test_the_pending_signal_cap_must_be_a_positive_integer(backend: Backend) -> None:
    for cap in (0, -1, True, 2.5):
        with pytest.raises(
            InvalidArgument, match=f"max_pending_signals must be an integer >= 1, got {cap!r}"
        ):
            open_store(backend.url, max_pending_signals=cap)  # type: ignore[arg-type]


def test_a_signal_flood_past_the_cap_is_refused_and_the_task_completes_on_its_signal(
    backend: Backend,
) -> None:
    store = open_store(backend.url, max_pending_signals=5)
    backend.opened.append(store)
    worker = _worker(store, policy=lambda sender, _name, _payload: sender == "warehouse")
    task_id = _waiting_task(store, worker)

    refused = []
    for n in range(40):
        try:
            store.send_signal(task_id, "shipped", {"spam": n}, signal_id=f"spam-{n}", sender="spammer")
        except SignalRefused as exc:
            refused.append(exc.why)
    assert refused == ["the task already has 5 pending signals (limit 5)"] * 35
    with pytest.raises(SignalRefused, match=r"5 pending signals \(limit 5\)"):
        store.send_signal(task_id, "shipped", {"ok": True}, signal_id="real", sender="warehouse")

    assert isinstance(worker.run_once(), Suspended)  # the five kept are refused by the policy
    assert store.pending_signals(task_id, "shipped") == []
    store.send_signal(task_id, "shipped", {"ok": True}, signal_id="real", sender="warehouse")
    assert worker.run_once() == Completed(task_id, {"order": "o1", "shipment": {"ok": True}})
    kinds = _kinds(store, task_id)
    # 36 refused when sent: the first 20 recorded, all counted; 5 refused by the policy.
    assert (kinds.count("signal_received"), kinds.count("signal_refused")) == (6, 20 + 5)
    assert store.get_task(task_id).refused_signals == 35 + 1


def test_past_a_bound_refused_signals_are_counted_not_recorded(backend: Backend) -> None:
    """A flood of refused signals grows the task's count, not its history: every refusal
    (the cap reached, another tenant's sender, a finished task) is counted, the first
    RECORDED_SIGNAL_REFUSALS are recorded with sender and reason, and the rest only
    counted, while the pending cap holds."""
    store = open_store(backend.url, max_pending_signals=2)
    backend.opened.append(store)
    worker = _worker(store)
    task_id = _waiting_task(store, worker, tenant="acme")
    for n in range(2):
        store.send_signal(task_id, "shipped", {"n": n}, signal_id=f"kept-{n}", sender="ops", tenant="acme")
    for n in range(300):
        with pytest.raises(SignalRefused):
            store.send_signal(
                task_id, "shipped", {"n": n}, signal_id=f"spam-{n}", sender="bot", tenant="acme"
            )
    with pytest.raises(TaskNotFound):
        store.send_signal(task_id, "shipped", 1, signal_id="foreign", sender="mallory", tenant="globex")

    assert store.get_task(task_id).refused_signals == 301
    assert len(store.pending_signals(task_id)) == 2
    history = store.history(task_id)
    refused = [e.detail for e in history if e.kind == "signal_refused"]
    assert [(d["signal_id"], d["sender"]) for d in refused] == [
        (f"spam-{n}", "bot") for n in range(RECORDED_SIGNAL_REFUSALS)
    ]
    assert refused[0]["refused"] == "the task already has 2 pending signals (limit 2)"
    assert len(history) == 3 + 2 + RECORDED_SIGNAL_REFUSALS  # enqueued, claimed, suspended; 2 kept

    store.cancel(task_id, "ops", "done")  # a finished task refuses too: counted
    with pytest.raises(SignalRefused):
        store.send_signal(task_id, "shipped", 1, signal_id="late", sender="ops", tenant="acme")
    assert store.get_task(task_id).refused_signals == 302
    assert [e.kind for e in store.history(task_id)][-1] == "cancelled"


def test_a_sender_refused_by_the_policy_is_recorded_and_the_workflow_keeps_waiting(
    store: WorkflowStore,
) -> None:
    seen_by_policy: list[tuple[str, str, Any]] = []

    def only_the_warehouse(sender: str, name: str, payload: Any) -> bool:
        seen_by_policy.append((sender, name, payload))
        return sender == "warehouse"

    worker = _worker(store, only_the_warehouse)
    task_id = _waiting_task(store, worker)
    forged = {"carrier": "fake", "tracking": "X"}
    store.send_signal(task_id, "shipped", forged, signal_id="forged", sender="mallory")

    assert isinstance(worker.run_once(), Suspended)
    assert store.get_task(task_id).state is TaskState.WAITING
    (refused,) = [e.detail for e in store.history(task_id) if e.kind == "signal_refused"]
    assert (refused["signal_id"], refused["sender"]) == ("forged", "mallory")
    assert refused["note"] == "sender 'mallory' refused by the definition's sender policy"
    assert store.pending_signals(task_id, "shipped") == []

    real = {"carrier": "dhl", "tracking": "T9"}
    store.send_signal(task_id, "shipped", real, signal_id="s2", sender="warehouse")
    assert worker.run_once() == Completed(task_id, {"order": "o1", "shipment": real})
    assert seen_by_policy == [("mallory", "shipped", forged), ("warehouse", "shipped", real)]
    (consumed,) = [e.detail for e in store.history(task_id) if e.kind == "signal_consumed"]
    assert (consumed["signal_id"], consumed["sender"]) == ("s2", "warehouse")


def test_a_sender_policy_that_raises_refuses_the_signal_instead_of_failing_the_task(
    store: WorkflowStore,
) -> None:
    def fragile_policy(sender: str, _name: str, payload: Any) -> bool:
        return bool(payload["approved_by"] == "ops")  # KeyError on a payload without the key

    worker = _worker(store, fragile_policy)
    task_id = _waiting_task(store, worker)
    store.send_signal(task_id, "shipped", {"carrier": "dhl"}, signal_id="odd", sender="warehouse")

    assert isinstance(worker.run_once(), Suspended)
    assert store.get_task(task_id).state is TaskState.WAITING
    (refused,) = [e.detail for e in store.history(task_id) if e.kind == "signal_refused"]
    assert (refused["signal_id"], refused["sender"]) == ("odd", "warehouse")
    assert refused["note"] == (
        "sender 'warehouse' refused: the definition's sender policy raised KeyError: 'approved_by'"
    )

    good = {"approved_by": "ops"}
    store.send_signal(task_id, "shipped", good, signal_id="good", sender="warehouse")
    assert worker.run_once() == Completed(task_id, {"order": "o1", "shipment": good})
