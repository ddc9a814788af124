"""A property-based test of the store contract: hypothesis drives random sequences of
enqueue, claim, heartbeat, checkpoint commit, suspend, retry, release, complete, fail and
store-clock moves against a real store and a model of it, with the leases of every claim
ever made (current and stale) used for the writes.

After every step each task's state, outcome, fencing token, revision and claim count in
the store equal the model's, and the fencing invariants hold: a write is accepted exactly
when its lease is the task's current, unexpired one (and, for progress, its revision is
the current one), tokens never decrease, and the history never shows a write under a
token after a write under a higher one.

Lease expiry and timers are store time moved with ``set_clock_offset`` in whole seconds;
the real time a test case takes only ever adds a little to store time, which the model's
"expired when expiry <= now" already accounts for (see ``_expired``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import attrs
import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runifold_sync import (
    LeaseDuration,
    LeaseLostError,
    TaskOutcome,
    TaskState,
    WorkerId,
    WorkflowStore,
    WorkflowTask,
    open_store,
)
from runifold_sync.codec import to_json
from runifold_sync.store.base import Lease

LEASE_S = 30
LEASE = LeaseDuration(timedelta(seconds=LEASE_S))
WORKERS = [WorkerId.parse("w1"), WorkerId.parse("w2")]
MAX_TASKS = 3


@attrs.define
class ModelTask:
    state: TaskState = TaskState.QUEUED
    outcome: TaskOutcome | None = None
    token: int = 0
    revision: int = 0
    claims: int = 0  # claims_since_progress
    ready_at: int | None = 0  # model seconds; None: waits with no timer
    lease_expires: int | None = None


class StoreMachine(RuleBasedStateMachine):
    open_fresh_store: Callable[[], tuple[WorkflowStore, Callable[[], None]]]

    def __init__(self) -> None:
        super().__init__()
        self.store, self._cleanup = type(self).open_fresh_store()
        self.now = 0  # model store time, seconds since the case began
        self.store.set_clock_offset(timedelta(0))
        self.tasks: dict[str, ModelTask] = {}
        self.leases: list[Lease] = []  # every lease ever handed out, stale ones included
        self.highest_token: dict[str, int] = {}

    def teardown(self) -> None:
        self.store.close()
        self._cleanup()

    # --- model helpers ---------------------------------------------------------------

    def _expired(self, task: ModelTask) -> bool:
        # Store now = model now + the real time the case has taken so far (>= every
        # earlier write's), so an expiry equal to model now has passed in the store.
        return task.lease_expires is not None and task.lease_expires <= self.now

    def _claimable(self) -> set[str]:
        ready = set()
        for task_id, task in self.tasks.items():
            if task.state in (TaskState.QUEUED, TaskState.WAITING):
                if task.ready_at is not None and task.ready_at <= self.now:
                    ready.add(task_id)
            elif task.state is TaskState.LEASED and self._expired(task):
                ready.add(task_id)
        return ready

    def _holds(self, lease: Lease) -> bool:
        task = self.tasks[lease.task_id]
        return (
            task.state is TaskState.LEASED and task.token == lease.fencing_token and not self._expired(task)
        )

    def _attempt(self, lease: Lease, accepted: bool, write: Callable[[], object]) -> bool:
        """Make a fenced write and check that the store accepted it exactly when the model says."""
        try:
            write()
        except LeaseLostError:
            assert not accepted, f"store refused a write the model accepts ({lease})"
            return False
        assert accepted, f"store accepted a write under a lease the model says is lost ({lease})"
        return True

    def _end_lease(self, task: ModelTask) -> None:
        task.lease_expires = None

    # --- rules -----------------------------------------------------------------------

    @precondition(lambda self: len(self.tasks) < MAX_TASKS)
    @rule(priority=st.sampled_from([0, 0, 1]))
    def enqueue(self, priority: int) -> None:
        task_id = f"t{len(self.tasks)}"
        task = WorkflowTask.new("flow", 1, {"n": len(self.tasks)}, checkpoint_id=task_id, priority=priority)
        assert self.store.enqueue(task).created
        self.tasks[task_id] = ModelTask()

    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker: WorkerId) -> None:
        self._claim(worker)

    @precondition(lambda self: any(t.state is TaskState.LEASED for t in self.tasks.values()))
    @rule(worker=st.sampled_from(WORKERS))
    def take_over(self, worker: WorkerId) -> None:
        """The common road to a stale lease: every lease expires, then someone claims."""
        self.advance_clock(LEASE_S + 1)
        self._claim(worker)

    def _claim(self, worker: WorkerId) -> None:
        ready = self._claimable()
        claimed = self.store.claim(worker, LEASE, limit=1)
        if not ready:
            assert claimed == []
            return
        assert len(claimed) == 1, (ready, claimed)
        lease = claimed[0].lease
        assert lease.task_id in ready
        task = self.tasks[lease.task_id]
        assert lease.fencing_token == task.token + 1
        assert claimed[0].revision == task.revision
        task.state, task.token, task.claims = TaskState.LEASED, lease.fencing_token, task.claims + 1
        task.lease_expires = self.now + LEASE_S
        self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(min_value=0))
    def heartbeat(self, pick: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        if self._attempt(lease, self._holds(lease), lambda: self.store.heartbeat(lease, LEASE)):
            self.tasks[lease.task_id].lease_expires = self.now + LEASE_S

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(min_value=0), behind=st.sampled_from([0, 0, 0, 1]))
    def commit(self, pick: int, behind: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        task = self.tasks[lease.task_id]
        revision = task.revision - behind
        accepted = self._holds(lease) and behind == 0
        checkpoint = to_json({"revision": revision + 1})
        if self._attempt(lease, accepted, lambda: self.store.commit_checkpoint(lease, revision, checkpoint)):
            task.revision += 1
            task.claims = 0

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(min_value=0), delay_s=st.sampled_from([None, 5, 40]))
    def suspend(self, pick: int, delay_s: int | None) -> None:
        lease = self.leases[pick % len(self.leases)]
        task = self.tasks[lease.task_id]
        wake_at = None if delay_s is None else self.store.now() + timedelta(seconds=delay_s)
        write = lambda: self.store.suspend(  # noqa: E731
            lease, task.revision, to_json({"waiting": True}), wake_at=wake_at, reason="wait"
        )
        if self._attempt(lease, self._holds(lease), write):
            task.state, task.revision, task.claims = TaskState.WAITING, task.revision + 1, 0
            task.ready_at = None if delay_s is None else self.now + delay_s
            self._end_lease(task)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(min_value=0), delay_s=st.sampled_from([0, 5, 40]))
    def retry(self, pick: int, delay_s: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        task = self.tasks[lease.task_id]
        write = lambda: self.store.retry(  # noqa: E731
            lease, task.revision, to_json({"retry": True}), delay=timedelta(seconds=delay_s), reason="again"
        )
        if self._attempt(lease, self._holds(lease), write):
            task.state, task.revision, task.claims = TaskState.QUEUED, task.revision + 1, 0
            task.ready_at = self.now + delay_s
            self._end_lease(task)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(min_value=0))
    def release(self, pick: int) -> None:
        lease = self.leases[pick % len(self.leases)]
        task = self.tasks[lease.task_id]
        write = lambda: self.store.release(lease, delay=timedelta(0), reason="not mine")  # noqa: E731
        if self._attempt(lease, self._holds(lease), write):
            task.state, task.claims, task.ready_at = TaskState.QUEUED, max(task.claims - 1, 0), self.now
            self._end_lease(task)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(min_value=0), failed=st.booleans())
    def finish(self, pick: int, failed: bool) -> None:
        lease = self.leases[pick % len(self.leases)]
        task = self.tasks[lease.task_id]
        if failed:
            write = lambda: self.store.fail(lease, task.revision, None, reason="it broke")  # noqa: E731
        else:
            write = lambda: self.store.complete(lease, task.revision, to_json({"done": 1}), to_json(1))  # noqa: E731
        if self._attempt(lease, self._holds(lease), write):
            task.state, task.revision = TaskState.TERMINAL, task.revision + 1
            task.outcome = TaskOutcome.FAILED if failed else TaskOutcome.COMPLETED
            task.ready_at = None
            self._end_lease(task)

    @rule(seconds=st.sampled_from([1, 5, 15, 29, 31]))
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        self.store.set_clock_offset(timedelta(seconds=self.now))

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        for task_id, task in self.tasks.items():
            record = self.store.get_task(task_id)
            got = (record.state, record.outcome, record.fencing_token, record.revision)
            assert got == (task.state, task.outcome, task.token, task.revision), (task_id, got, task)
            assert record.claims_since_progress == task.claims, (task_id, record, task)

    @invariant()
    def tokens_never_fall_and_no_stale_write_is_in_the_history(self) -> None:
        for task_id in self.tasks:
            record = self.store.get_task(task_id)
            assert record.fencing_token >= self.highest_token.get(task_id, 0)
            self.highest_token[task_id] = record.fencing_token
            highest = 0
            for event in self.store.history(task_id):
                if event.fencing_token is not None:
                    assert event.fencing_token >= highest, (task_id, event)
                    highest = event.fencing_token


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _run(open_fresh_store: Callable[[], tuple[WorkflowStore, Callable[[], None]]], examples: int) -> None:
    machine = type("Machine", (StoreMachine,), {"open_fresh_store": staticmethod(open_fresh_store)})
    machine.TestCase.settings = settings(SETTINGS, max_examples=examples)
    machine.TestCase().runTest()


@pytest.mark.timeout(300)
def test_store_contract_state_machine_on_sqlite() -> None:
    def fresh() -> tuple[WorkflowStore, Callable[[], None]]:
        directory = Path(tempfile.mkdtemp(prefix="runifold-sm-"))
        return open_store(f"sqlite:///{directory / 'w.db'}"), lambda: shutil.rmtree(directory, True)

    _run(fresh, examples=100)


@pytest.fixture
def postgres_tables(postgres_url: str) -> Iterator[str]:
    open_store(postgres_url).close()  # migrate once
    yield postgres_url


@pytest.mark.timeout(300)
def test_store_contract_state_machine_on_postgres(postgres_tables: str) -> None:
    url = postgres_tables

    def fresh() -> tuple[WorkflowStore, Callable[[], None]]:
        with psycopg.connect(url, autocommit=True) as conn:  # a fresh database's contents
            conn.execute(
                "TRUNCATE runifold_tasks, runifold_events, runifold_signals, runifold_effect_resolutions"
            )
        return open_store(url), lambda: None

    _run(fresh, examples=30)
