"""Callers that wait for tasks to finish through a chaos run, as a web request waits for
its job: a few threads call ``store.wait_for_task`` on the tasks in the order they were
enqueued, each on a store of its own, through the kills, stops and database restarts.

On PostgreSQL a task's end is NOTIFYed only once a waiter has marked it awaited (schema
version 19), so a waiter that marked too late, or a transition that skipped a mark it
should have seen, leaves a wait blocked on a task that has ended. The invariant counts
those: a wait that did not return the task finished although the task had ended more
than ``HEARD_WITHIN_S`` before the wait gave up (timed out, or was still blocked when the
run ended). Store time is wall time here (no offset), as for the kills.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import timedelta

import attrs
from chaos_db import note

from runifold_sync import open_store
from runifold_sync.errors import StoreUnavailable, TaskNotFound, WaitTimedOut
from runifold_sync.store import TaskRecord
from runifold_sync.store.sql_results import FINISHED  # what wait_for_task returns for

WAITING_THREADS = 6
WAIT_S = 10.0  # one wait's timeout: a task may well take longer (its signal, a kill)
HEARD_WITHIN_S = 5.0  # an end unheard for this long is missed
# A stop of the ending worker this long after its end's statement began still froze the
# transaction before its COMMIT: the end is visible only from the SIGCONT.
FREEZE_SLACK_S = 1.0


@attrs.frozen
class Wait:
    task_id: str
    started: float  # wall time the call began
    ended: float  # wall time it returned, timed out, or the run ended while it waited
    heard: bool  # it returned the task finished


class ResultWaiters:
    """The waiting threads (daemons: a wait cannot be interrupted, so the run does not
    join them; what each was waiting for when the run ended is recorded by ``finish``)."""

    def __init__(self, url: str, task_ids: Iterable[str]) -> None:
        self.url = url
        self.waits: list[Wait] = []
        self._queue = deque(task_ids)
        self._open: dict[int, tuple[str, float]] = {}  # thread ident -> its wait now
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"chaos-waiter-{n}", daemon=True)
            for n in range(WAITING_THREADS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def finish(self) -> list[Wait]:
        """Every wait, the ones still blocked counted as ended now without hearing."""
        self._stop.set()
        now = time.time()
        with self._lock:
            return self.waits + [
                Wait(task_id, started, now, False) for task_id, started in self._open.values()
            ]

    def _next(self) -> str | None:
        with self._lock:
            return self._queue.popleft() if self._queue and not self._stop.is_set() else None

    def _run(self) -> None:
        store = None
        task_id = self._next()
        while task_id is not None and not self._stop.is_set():
            started = time.time()
            try:
                store = store or open_store(self.url)
                with self._lock:
                    self._open[threading.get_ident()] = (task_id, started)
                store.wait_for_task(task_id, timedelta(seconds=WAIT_S))
                self._ended(Wait(task_id, started, time.time(), True))
                task_id = self._next()
            except WaitTimedOut:
                self._ended(Wait(task_id, started, time.time(), False))
            except TaskNotFound:  # not enqueued yet
                self._ended(None)
                self._stop.wait(0.05)
            except StoreUnavailable as exc:  # the server restarting: wait again shortly
                note(f"waiter: {type(exc).__name__}")
                self._ended(None)
                self._stop.wait(0.1)
        if store is not None:
            store.close()

    def _ended(self, wait: Wait | None) -> None:
        with self._lock:
            self._open.pop(threading.get_ident(), None)
            if wait is not None and not self._stop.is_set():
                self.waits.append(wait)


def unheard_ends(
    waits: Iterable[Wait], tasks: Mapping[str, TaskRecord], frozen: Iterable[tuple[str, float, float]] = ()
) -> list[str]:
    """Waits that gave up on a task which had ended ``HEARD_WITHIN_S`` or more before.
    ``frozen`` are the stops, (worker id, stopped at, resumed at): a task ended by a
    worker stopped before its transaction committed ended, for its waiters, at the
    resume (its ``updated_at`` is when the statement ran)."""
    stops = list(frozen)
    missed = []
    for wait in waits:
        task = tasks.get(wait.task_id)
        if wait.heard or task is None or task.state not in FINISHED:
            continue
        ended_at = task.updated_at.timestamp()
        for worker_id, stopped_at, resumed_at in stops:
            if worker_id == task.worker_id and stopped_at - FREEZE_SLACK_S <= ended_at <= resumed_at:
                ended_at = resumed_at
        if wait.ended - max(ended_at, wait.started) > HEARD_WITHIN_S:
            missed.append(
                f"{wait.task_id} ended at {ended_at:.3f}; a wait from {wait.started:.3f} "
                f"gave up at {wait.ended:.3f} without hearing it"
            )
    return missed


def woken_by_the_end(waits: Iterable[Wait], tasks: Mapping[str, TaskRecord]) -> int:
    """Waits that heard an end made after they began: woken, not answered by their first read."""
    return sum(
        1
        for wait in waits
        if wait.heard and wait.task_id in tasks and tasks[wait.task_id].updated_at.timestamp() > wait.started
    )
