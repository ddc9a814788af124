"""``run_until_idle`` on both stores: timers, waits' timeouts and retry backoffs skipped
to at store time, waits with no deadline stopping it, signals between two calls, children,
the cycle bound and what it refuses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowStore
from runifold_sync.errors import InvalidArgument
from runifold_sync.outcomes import Completed, ContinuedAsNew, Retried, Suspended
from runifold_sync.store import TaskState, TenantBudget, TenantPolicy
from runifold_sync.testing import NotIdle, StoreClock, result, run_until_idle, send_signal

from . import workflows
from .workflows import registry


@pytest.fixture(autouse=True)
def _fresh_attempts() -> Iterator[None]:
    workflows.ATTEMPTS.clear()
    yield


def enqueue(store: WorkflowStore, name: str, value: object, task_id: str) -> str:
    return store.enqueue(registry(*ALL).task(name, 1, value, checkpoint_id=task_id)).task_id


ALL = (workflows.sleeper, workflows.listener, workflows.flaky, workflows.parent, workflows.forever)


def test_a_workflow_sleeping_a_day_finishes_in_well_under_a_second(store: WorkflowStore) -> None:
    task_id = enqueue(store, "sleeper", "ada", "t-sleep")
    store_started = store.now()
    started = time.monotonic()

    outcomes = run_until_idle(store, registry(workflows.sleeper))

    assert time.monotonic() - started < 1.0
    assert [type(o) for o in outcomes] == [Suspended, Completed]
    assert outcomes[-1] == Completed(task_id, "good morning, ada")
    assert store.now() - store_started >= timedelta(days=1)


def test_without_skip_time_it_stops_at_the_timer(store: WorkflowStore) -> None:
    task_id = enqueue(store, "sleeper", "ada", "t-no-skip")
    before = store.now()

    [outcome] = run_until_idle(store, registry(workflows.sleeper), skip_time=False)

    assert isinstance(outcome, Suspended) and outcome.wake_at is not None
    assert store.get_task(task_id).state is TaskState.WAITING
    assert store.now() - before < timedelta(minutes=1)  # the clock was left alone
    StoreClock(store).advance_to(outcome.wake_at)
    assert run_until_idle(store, registry(workflows.sleeper), skip_time=False) == [
        Completed(task_id, "good morning, ada")
    ]


def test_a_wait_with_no_deadline_stops_it_and_a_signal_between_calls_is_delivered(
    store: WorkflowStore,
) -> None:
    task_id = enqueue(store, "listener", None, "t-listen")
    before = store.now()

    [waiting] = run_until_idle(store, registry(workflows.listener))

    assert isinstance(waiting, Suspended) and waiting.wake_at is None
    assert store.now() - before < timedelta(minutes=1)  # nothing to skip to
    send_signal(store, task_id, "go", {"colour": "green"})
    assert run_until_idle(store, registry(workflows.listener)) == [Completed(task_id, {"colour": "green"})]


def test_retry_backoffs_are_skipped(store: WorkflowStore) -> None:
    task_id = enqueue(store, "flaky", None, "t-flaky")

    outcomes = run_until_idle(store, registry(workflows.flaky))

    assert [type(o) for o in outcomes] == [Retried, Retried, Completed]
    assert result(store, task_id) == 3


def test_a_parent_and_its_child_both_finish_in_one_call(store: WorkflowStore) -> None:
    task_id = enqueue(store, "parent", None, "t-parent")

    run_until_idle(store, registry(workflows.parent, workflows.sleeper))

    assert result(store, task_id) == "child said: good morning, child"


def test_timers_due_at_different_times_run_in_their_order(store: WorkflowStore) -> None:
    later = enqueue(store, "sleeper", "later", "t-later")
    StoreClock(store).advance(timedelta(hours=1))
    sooner = enqueue(store, "sleeper", "sooner", "t-sooner")
    run_until_idle(store, registry(workflows.sleeper), skip_time=False)  # both asleep now
    StoreClock(store).advance(timedelta(hours=23, minutes=30))  # "sooner" wakes 1 h after "later"

    completed = [o.task_id for o in run_until_idle(store, registry(workflows.sleeper))]

    assert completed == [later, sooner]


def test_a_workflow_that_never_ends_is_stopped_by_max_cycles_naming_it(store: WorkflowStore) -> None:
    task_id = enqueue(store, "forever", 0, "t-forever")

    with pytest.raises(NotIdle) as raised:
        run_until_idle(store, registry(workflows.forever), max_cycles=7)

    assert raised.value.unfinished == (task_id,)
    assert "max_cycles=7" in str(raised.value) and repr(task_id) in str(raised.value)
    assert any(isinstance(o, ContinuedAsNew) for o in raised.value.outcomes)


def test_a_task_whose_definition_the_registry_lacks_stops_it_at_once(store: WorkflowStore) -> None:
    enqueue(store, "sleeper", "ada", "t-unknown")

    with pytest.raises(NotIdle, match="'sleeper' version 1, which the registry lacks") as raised:
        run_until_idle(store, registry(workflows.listener))

    assert raised.value.unfinished == ("t-unknown",)
    assert raised.value.outcomes == ()  # claims route around it: nothing was claimed


def test_a_paused_task_is_not_skipped_to(store: WorkflowStore) -> None:
    task_id = enqueue(store, "sleeper", "ada", "t-paused")
    run_until_idle(store, registry(workflows.sleeper), skip_time=False)
    store.pause(task_id, actor="test", reason="hold it")
    before = store.now()

    assert run_until_idle(store, registry(workflows.sleeper)) == []
    assert store.now() - before < timedelta(minutes=1)
    store.resume(task_id, actor="test", reason="go on")  # due at once: the timer sleeps again
    assert run_until_idle(store, registry(workflows.sleeper))[-1] == Completed(task_id, "good morning, ada")


def test_tasks_on_every_queue_are_run_unless_queues_narrows_it(store: WorkflowStore) -> None:
    kit = registry(workflows.sleeper)
    mail = store.enqueue(kit.task("sleeper", 1, "mail", checkpoint_id="t-mail", queue="mail")).task_id
    plain = enqueue(store, "sleeper", "plain", "t-plain")

    assert run_until_idle(store, kit, queues=["default"])[-1] == Completed(plain, "good morning, plain")
    assert store.get_task(mail).state is TaskState.QUEUED  # left alone: not a queue it was given
    assert run_until_idle(store, kit)[-1] == Completed(mail, "good morning, mail")


def test_a_child_enqueued_on_another_queue_during_the_run_is_run_too(store: WorkflowStore) -> None:
    kit = registry(workflows.sleeper, workflows.mail_parent)
    task_id = store.enqueue(kit.task("mail-parent", 1, None, checkpoint_id="t-mail-parent")).task_id

    assert run_until_idle(store, kit)[-1] == Completed(task_id, "child said: good morning, mail child")


# The sleeper as changed without a new version: a step more, so other step fingerprints.
changed_sleeper = Workflow("sleeper", 1)


@changed_sleeper.step()
def stretch(ctx: StepContext) -> None:
    return None


@changed_sleeper.step()
def wake(ctx: StepContext, name: str) -> str:
    return f"good morning, {name}"


@changed_sleeper.main
def sleep_and_stretch(ctx: WorkflowContext, name: str) -> str:
    ctx.sleep(timedelta(days=1))
    stretch(ctx)
    return wake(ctx, name)


def test_a_task_whose_steps_changed_under_the_same_version_stops_it_naming_the_task(
    store: WorkflowStore,
) -> None:
    task_id = enqueue(store, "sleeper", "ada", "t-changed")
    run_until_idle(store, registry(workflows.sleeper), skip_time=False)  # checkpointed, asleep

    with pytest.raises(NotIdle) as raised:
        run_until_idle(store, registry(changed_sleeper))

    old, new = workflows.sleeper.fingerprint(), changed_sleeper.fingerprint()
    assert str(raised.value).startswith(
        f"task 't-changed' was checkpointed by 'sleeper' version 1 with step fingerprint {old}, "
        f"but the registry's has fingerprint {new}: its steps changed under the same version"
    )
    assert raised.value.unfinished == (task_id,)


def test_a_tenant_over_its_budget_is_run_again_once_store_time_frees_its_window(
    store: WorkflowStore,
) -> None:
    store.set_tenant_policy(TenantPolicy("acme", budget=TenantBudget(5, timedelta(hours=1))))
    kit = registry(workflows.spender)
    first = store.enqueue(kit.task("spender", 1, 5, checkpoint_id="t-first", tenant="acme")).task_id
    second = store.enqueue(kit.task("spender", 1, 5, checkpoint_id="t-second", tenant="acme")).task_id
    before = store.now()

    assert run_until_idle(store, kit) == [Completed(first, 5.0), Completed(second, 5.0)]
    assert store.now() - before >= timedelta(hours=1)  # skipped, not waited for


def test_a_tenant_budget_that_nothing_will_free_stops_it_saying_so(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", budget=TenantBudget(0, timedelta(hours=1))))
    kit = registry(workflows.spender)
    held = store.enqueue(kit.task("spender", 1, 1, checkpoint_id="t-held", tenant="acme")).task_id

    with pytest.raises(NotIdle, match="deferred by budget admission: tenant 'acme'") as raised:
        run_until_idle(store, kit)

    assert raised.value.unfinished == (held,)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"skip_time": "yes"}, "'yes'"),
        ({"max_cycles": 0}, "max_cycles"),
        ({"worker_id": 7}, "7"),
        ({"worker_id": "no spaces"}, "'no spaces'"),
        ({"queues": "mail"}, "write \\['mail'\\]"),
        ({"queues": []}, "queues must name at least one queue"),
        ({"queues": ["bad name\n"]}, "queue"),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    store: WorkflowStore, keywords: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidArgument, match=named):
        run_until_idle(store, registry(workflows.sleeper), **keywords)  # type: ignore[arg-type]
