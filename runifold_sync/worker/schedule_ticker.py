"""Creating schedules' due ticks from every running worker.

Every ``WorkflowWorker.run`` (each process of every pool, on every host) runs a
:class:`ScheduleTicker`: a daemon thread beside the worker loop, so a tick is created on
time even while every worker is busy in a long step. It ticks the registry's schedules
and those created at run time (``store.create_schedule``) whose workflow version the
registry serves, which it reads again at each look. No process is in
charge and none needs to be: a tick's task is created by ``store.create_tick``, which
writes it and the schedule's ``last_tick`` in one transaction on the locked schedule
row, so the first process to reach a tick creates it and the others find it done.

What it costs when nothing is due: a look every ``CREATED_LOOK_S`` (store time and one
indexed read of the created schedules, so a new one is picked up without a restart). The
thread knows from the store's answers when each schedule's next tick falls, and sleeps
until the first of them or the next look. At a tick, each process
reads the schedule row and only the first writes; a small random delay spreads them.
The ticks that fell while no worker ran are not created one by one: only the latest of
them is (``ScheduleTimes.latest_due``).

Store time decides what is due (``store.now()``), never this host's clock; the sleep
between looks is only an estimate measured on the monotonic clock.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import attrs

from ..errors import RunifoldError, ScheduleNotFound
from ..model import crashpoints
from ..model.schedules import Schedule
from ..store.base import WorkflowStore
from ..workflow.registry import WorkflowRegistry

log = logging.getLogger("runifold_sync.model.schedules")
MAX_SLEEP_S = 60.0
# How soon a running worker ticks a schedule created at run time (store.create_schedule)
# or stops ticking a deleted one: each pass reads the created ones, one indexed read.
CREATED_LOOK_S = 5.0
RETRY_S = 5.0  # after a pass failed (the store unreachable): the next try
READY_POLL_S = 0.05  # before the worker has registered: the next look
JITTER_S = 0.02  # at most this late after a tick, so the processes reaching it do not all write


@attrs.frozen
class TickPass:
    """One look at every schedule: the task ids it created, store time when it looked,
    and the earliest tick after that (None without schedules)."""

    created: tuple[str, ...]
    now: datetime
    next_due: datetime | None

    def sleep_s(self) -> float:
        """How long to wait before the next look."""
        if self.next_due is None:
            return MAX_SLEEP_S
        wait = (self.next_due - self.now).total_seconds() + random.uniform(0, JITTER_S)
        return min(max(wait, 0.0), MAX_SLEEP_S)


class ScheduleTicks:
    """The due ticks of ``registry``'s schedules, created in ``store``. Remembers where
    each schedule's row stood (``ticks_after``), which only ever moves forward, so a look
    between ticks sends nothing but ``store.now()``."""

    def __init__(self, store: WorkflowStore, registry: WorkflowRegistry) -> None:
        self.store = store
        self.registry = registry
        self._after: dict[str, datetime] = {}
        self._declared = False

    def run(self) -> TickPass:
        """Declare the schedules (the first time), then create each one's due tick: the
        registry's, and those created at run time (``store.create_schedule``, read again
        at every pass) whose workflow version this registry has."""
        declared = self.registry.schedules
        if not self._declared:
            self.store.declare_schedules(declared)
            self._declared = True
        names = {s.name for s in declared}
        runtime = [s for s in self.store.created_schedules() if s.name not in names and self._serves(s)]
        for gone in set(self._after) - names - {s.name for s in runtime}:
            del self._after[gone]  # a created schedule deleted since
        schedules = [*declared, *runtime]
        now = self.store.now()
        created = []
        for schedule in schedules:
            task_id = self._create_due(schedule, now, declared=schedule.name in names)
            if task_id is not None:
                created.append(task_id)
        upcoming = [
            s.times.next_after(max(self._after[s.name], now)) for s in schedules if s.name in self._after
        ]
        return TickPass(tuple(created), now, min(upcoming, default=None))

    def _serves(self, schedule: Schedule) -> bool:
        """Whether this registry can make the ticks' tasks of a created schedule (its
        workflow version, an input that fits); a pool whose registry has it ticks it."""
        try:
            self.registry.tick_task(schedule, schedule.times.next_after(datetime.now(UTC)))
        except RunifoldError:
            return False
        return True

    def _create_due(self, schedule: Schedule, now: datetime, *, declared: bool = True) -> str | None:
        known = self._after.get(schedule.name)
        if known is not None and schedule.times.latest_due(known, now) is None:
            return None  # not due by what the row said last: nothing to ask
        try:
            record = self.store.schedule(schedule.name)  # a read: another process may have made it
        except ScheduleNotFound:
            if not declared:  # a created schedule deleted since the pass read it
                self._after.pop(schedule.name, None)
                return None
            log.warning(
                "schedule %s is no longer stored (an operator removed it?); this worker's registry "
                "adds it, so it is stored again, starting from now",
                schedule.name,
            )
            self.store.declare_schedules([schedule])
            record = self.store.schedule(schedule.name)
        due = None if record.paused else schedule.times.latest_due(record.ticks_after, now)
        if due is None:
            # Paused: look again at the next tick, not at every pass.
            self._after[schedule.name] = max(record.ticks_after, now) if record.paused else record.ticks_after
            return None
        task = self.registry.tick_task(schedule, due)
        if crashpoints.ARMED:
            crashpoints.reached("before_tick", schedule.name)
        try:
            attempt = self.store.create_tick(schedule.name, due, task)
        except ScheduleNotFound:  # removed since the read: stored again at the next look (if declared)
            self._after[schedule.name] = record.ticks_after
            return None
        if crashpoints.ARMED:
            crashpoints.reached("after_tick", schedule.name)
        self._after[schedule.name] = attempt.schedule.ticks_after
        if not attempt.created:
            return None
        log.info("schedule %s: created %s", schedule.name, task.task_id, extra={"task_id": task.task_id})
        return task.task_id

    def forget(self) -> None:
        """Ask the store again from the next pass (after an error: the rows may be gone,
        a restored database)."""
        self._after.clear()
        self._declared = False


class ScheduleTicker:
    """The thread that runs :class:`ScheduleTicks` for one worker until :meth:`close`.
    It declares the schedules only once ``registered()`` says the worker is in the
    store's worker registry, so the declaration is after the worker's start: what
    ``schedules`` goes by to flag a schedule no live worker declares."""

    def __init__(
        self, store: WorkflowStore, registry: WorkflowRegistry, name: str, registered: Callable[[], bool]
    ) -> None:
        self._ticks = ScheduleTicks(store, registry)
        self._store = store
        self._registered = registered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"runifold-schedules-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            if not self._registered():
                delay = READY_POLL_S
                continue
            try:
                delay = min(self._ticks.run().sleep_s(), CREATED_LOOK_S)
            except Exception as exc:
                self._ticks.forget()
                self._store.outage.report(log, "creating schedule ticks failed; retrying", exc, {})
                delay = RETRY_S
                continue
            self._store.outage.answered()

    def close(self, timeout: timedelta = timedelta(seconds=10)) -> None:
        """Stop the thread; a pass under way finishes its transaction first."""
        self._stop.set()
        self._thread.join(timeout.total_seconds())
