"""``WorkflowSupervisor``: a parent process that forks a bounded pool of workers.

The parent holds no store connection and starts no thread, so nothing crosses a fork:
each child calls the worker factory after it starts and opens its own store. (The
process that calls ``run()`` should not have other threads inside SQLite or libpq
either: a fork while one holds a lock there leaves it held in the child, which hangs.)
Children report each outcome kind over a pipe, which the parent reads ten times a
second (and reaps dead children as often). An idle child waits in the store's
``wait_for_work`` (woken by NOTIFY on PostgreSQL) for up to its backoff. A cycle that
fails on an unreachable store is logged and retried after ``max_backoff`` in the same
child. Shutdown (the token, SIGINT or SIGTERM) reaches children as SIGTERM, which only
cancels their token: a started cycle finishes its lease protocol before the child exits
(its completion claiming no next task), an idle one stops within ``_IDLE_WAIT_SLICE_S``,
and one still running after ``shutdown_grace`` is SIGKILLed, its task claimed again once
its lease expires.
"""

from __future__ import annotations

import logging
import os
import random
import selectors
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType

import attrs

from .errors import InvalidArgument
from .models import WorkerId, check_count, check_positive_timedelta
from .outcomes import Idle, Yielded
from .worker import WorkflowWorker

log = logging.getLogger("runifold_sync.supervisor")

_EXIT_DONE = 0
_EXIT_RECYCLE = 75
_EXIT_CRASHED = 70
_QUICK_CRASH_S = 10.0  # a child that dies sooner than this after starting counts as crash-looping
# Longest single wait_for_work call of an idle child: the bound on how late it sees SIGTERM.
_IDLE_WAIT_SLICE_S = 0.5


class CancellationToken:
    """A one-way stop flag that signal handlers may set (they only call ``cancel``)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True as soon as the token is cancelled."""
        return self._event.wait(timeout_s)


def _check_concurrency(_inst: object, _attr: object, value: int) -> None:
    check_count("concurrency", value)


@attrs.frozen
class WorkflowSupervisorConfig:
    """``concurrency`` is the number of worker processes. It bounds claim-and-execute
    cycles on this host only; it is no substitute for tenant admission or pool limits."""

    concurrency: int = attrs.field(validator=_check_concurrency)
    min_backoff: timedelta = timedelta(milliseconds=25)
    max_backoff: timedelta = timedelta(seconds=5)
    shutdown_grace: timedelta = timedelta(seconds=60)
    recycle_after_tasks: int | None = None

    def with_backoff(self, minimum: timedelta, maximum: timedelta) -> WorkflowSupervisorConfig:
        check_positive_timedelta("minimum backoff", minimum)
        check_positive_timedelta("maximum backoff", maximum)
        if minimum > maximum:
            raise InvalidArgument(f"minimum backoff {minimum} is above maximum backoff {maximum}")
        return attrs.evolve(self, min_backoff=minimum, max_backoff=maximum)

    def with_shutdown_grace(self, grace: timedelta) -> WorkflowSupervisorConfig:
        return attrs.evolve(self, shutdown_grace=check_positive_timedelta("shutdown grace", grace))

    def with_recycling(self, tasks: int) -> WorkflowSupervisorConfig:
        return attrs.evolve(self, recycle_after_tasks=check_count("recycle_after_tasks", tasks))


@attrs.frozen
class SupervisorReport:
    """What the children reported, one line per cycle over their pipes. A child killed
    between a commit and its report takes that count with it; the store's task states,
    not these counts, are the record of what finished."""

    outcomes: dict[str, int]
    per_worker: dict[str, dict[str, int]]
    restarts: int
    recycled: int


class IdleBackoff:
    """Exponential idle delay between min and max, jittered over the upper half of each
    step so idle workers do not poll the store in lockstep. The first step spans
    [min, 2 * min] (capped at max): starting at exactly min would put workers that went
    idle together back in step on their first wait."""

    def __init__(self, minimum: timedelta, maximum: timedelta) -> None:
        self._min_s = minimum.total_seconds()
        self._max_s = maximum.total_seconds()
        self._first_s = min(2 * self._min_s, self._max_s)
        self._current_s = self._first_s

    def reset(self) -> None:
        self._current_s = self._first_s

    def next_s(self) -> float:
        delay = random.uniform(max(self._min_s, self._current_s / 2), self._current_s)
        self._current_s = min(self._current_s * 2, self._max_s)
        return delay


class WorkflowSupervisor:
    def __init__(
        self,
        worker_factory: Callable[[WorkerId], WorkflowWorker],
        config: WorkflowSupervisorConfig,
        *,
        base_id: str = "worker",
    ) -> None:
        if not callable(worker_factory):
            raise InvalidArgument(f"worker_factory must be callable, got {worker_factory!r}")
        if not isinstance(config, WorkflowSupervisorConfig):
            raise InvalidArgument(f"config must be a WorkflowSupervisorConfig, got {config!r}")
        WorkerId.parse(f"{base_id}-{config.concurrency}")  # validates the base id
        self._factory = worker_factory
        self._config = config
        self._base_id = base_id

    def run(self, token: CancellationToken) -> SupervisorReport:
        """Run the pool until ``token`` is cancelled (or SIGINT/SIGTERM arrives in the
        main thread), then wait for children to finish their started cycles."""
        counts: dict[str, Counter[str]] = {}
        children: dict[int, _Child] = {}
        selector = selectors.DefaultSelector()
        restarts = recycled = 0
        respawn_at: dict[int, tuple[float, int]] = {}  # slot -> (monotonic due, quick crashes)
        with _stop_signals(token):
            for slot in range(self._config.concurrency):
                self._spawn(slot, children, selector, crashes=0)
            while children or respawn_at:
                if token.cancelled:
                    recycled += self._stop_children(children, selector, counts)
                    break
                # Reports are read in batches: waking for each one cost the parent about
                # 25 us of CPU per task, on the cores its busy children share.
                token.wait(0.1)
                self._read_reports(selector, counts, timeout_s=0)
                for pid, child, status in _reap(children):
                    self._drain(child, selector, counts)
                    code = os.waitstatus_to_exitcode(status)
                    if code == _EXIT_RECYCLE:
                        recycled += 1
                    if token.cancelled:
                        continue
                    crashes = 0
                    if code != _EXIT_RECYCLE:
                        restarts += 1
                        quick = time.monotonic() - child.started < _QUICK_CRASH_S
                        crashes = child.crashes + 1 if quick else 0
                        log.warning(
                            "worker %s (pid %d) exited with %d; restarting",
                            child.worker_id,
                            pid,
                            code,
                            extra={"worker_id": child.worker_id},
                        )
                    respawn_at[child.slot] = (time.monotonic() + self._respawn_delay_s(crashes), crashes)
                for slot, (due, crashes) in list(respawn_at.items()):
                    if time.monotonic() >= due:
                        del respawn_at[slot]
                        self._spawn(slot, children, selector, crashes=crashes)
        selector.close()
        per_worker = {wid: dict(c) for wid, c in sorted(counts.items())}
        total: Counter[str] = Counter()
        for c in counts.values():
            total.update(c)
        return SupervisorReport(dict(total), per_worker, restarts, recycled)

    def _respawn_delay_s(self, quick_crashes: int) -> float:
        """A child that keeps dying at start (store down, broken app) is restarted with a
        growing delay instead of in a tight fork loop."""
        if quick_crashes == 0:
            return 0.0
        delay_s: float = 0.1 * 2.0 ** (quick_crashes - 1)
        return min(delay_s, self._config.max_backoff.total_seconds())

    def _spawn(
        self, slot: int, children: dict[int, _Child], selector: selectors.BaseSelector, *, crashes: int
    ) -> None:
        worker_id = WorkerId.parse(f"{self._base_id}-{slot}")
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns into the parent's stack
            code = _EXIT_CRASHED
            try:
                os.close(read_fd)
                code = _child_main(self._factory, worker_id, self._config, write_fd)
            except BaseException:
                log.exception("worker %s crashed", worker_id, extra={"worker_id": worker_id.value})
            finally:
                os._exit(code)
        os.close(write_fd)
        child = _Child(slot, worker_id.value, read_fd, crashes)
        children[pid] = child
        selector.register(read_fd, selectors.EVENT_READ, child)

    def _read_reports(
        self, selector: selectors.BaseSelector, counts: dict[str, Counter[str]], timeout_s: float
    ) -> None:
        for key, _ in selector.select(timeout_s):
            child: _Child = key.data
            data = os.read(child.fd, 65536)
            if data:
                child.take(data, counts)

    def _drain(
        self, child: _Child, selector: selectors.BaseSelector, counts: dict[str, Counter[str]]
    ) -> None:
        while data := os.read(child.fd, 65536):
            child.take(data, counts)
        selector.unregister(child.fd)
        os.close(child.fd)

    def _stop_children(
        self, children: dict[int, _Child], selector: selectors.BaseSelector, counts: dict[str, Counter[str]]
    ) -> int:
        """SIGTERM the children, wait out the grace, SIGKILL the rest. Returns how many
        exited to be recycled (their last task was done as the stop came)."""
        for pid in children:
            _signal(pid, signal.SIGTERM)
        recycled = 0
        deadline = time.monotonic() + self._config.shutdown_grace.total_seconds()
        while children and time.monotonic() < deadline:
            self._read_reports(selector, counts, timeout_s=0.05)
            for _pid, child, status in _reap(children):
                self._drain(child, selector, counts)
                recycled += os.waitstatus_to_exitcode(status) == _EXIT_RECYCLE
        for pid, child in list(children.items()):
            log.error(
                "worker %s did not stop within the grace period; killing it",
                child.worker_id,
                extra={"worker_id": child.worker_id},
            )
            _signal(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._drain(child, selector, counts)
            del children[pid]
        return recycled


@attrs.define
class _Child:
    slot: int
    worker_id: str
    fd: int
    crashes: int  # consecutive quick crashes of this slot before this child
    started: float = attrs.Factory(time.monotonic)
    partial: bytes = b""

    def take(self, data: bytes, counts: dict[str, Counter[str]]) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        counts.setdefault(self.worker_id, Counter()).update(ln.decode() for ln in lines if ln)


def _reap(children: dict[int, _Child]) -> Iterator[tuple[int, _Child, int]]:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            yield pid, children.pop(pid), status


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


@contextmanager
def _stop_signals(token: CancellationToken) -> Iterator[None]:
    """SIGINT and SIGTERM cancel the token while the supervisor runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum: int, _frame: FrameType | None) -> None:
        token.cancel()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _child_main(
    factory: Callable[[WorkerId], WorkflowWorker],
    worker_id: WorkerId,
    config: WorkflowSupervisorConfig,
    report_fd: int,
) -> int:
    token = CancellationToken()
    signal.signal(signal.SIGTERM, lambda _s, _f: token.cancel())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into SIGTERM
    worker = factory(worker_id)
    fields = {"worker_id": worker_id.value}
    backoff = IdleBackoff(config.min_backoff, config.max_backoff)
    tasks = 0
    due_but_unclaimable = False
    try:
        while not token.cancelled:
            # Claim the next task with this one's completion unless this child is
            # recycled after the cycle or stops: the worker checks the token again just
            # before the completion, so a SIGTERM during the cycle makes no new claim.
            last = config.recycle_after_tasks is not None and tasks + 1 >= config.recycle_after_tasks
            try:
                outcome = worker.run_once(claim_next=not last, stopping=token)
            except Exception:
                # An unreachable store (a database restart) ends the cycle, not the child:
                # the store reconnects, and a task the cycle held is claimed again once its
                # lease expires.
                log.exception("worker %s: cycle failed; backing off", worker_id, extra=fields)
                token.wait(config.max_backoff.total_seconds())
                continue
            os.write(report_fd, f"{outcome.kind}\n".encode())
            if isinstance(outcome, Idle):
                try:
                    # Work due right after an empty claim either just arrived (claim again
                    # at once) or is work this worker may not take: held by tenant
                    # admission, or rows other claimers hold. Twice in a row means the
                    # latter: sleep the backoff out rather than ask the store again at once.
                    due_now = worker.store.wait_for_work(timedelta(0))
                    if due_now and due_but_unclaimable:
                        token.wait(backoff.next_s())
                        due_but_unclaimable = False
                    else:
                        due_but_unclaimable = due_now
                        if not due_now:
                            _wait_for_work(worker, backoff.next_s(), token)
                except Exception:
                    log.exception("worker %s: waiting for work failed; backing off", worker_id, extra=fields)
                    token.wait(config.max_backoff.total_seconds())
                continue
            backoff.reset()
            if not isinstance(outcome, Yielded):
                tasks += 1
            if config.recycle_after_tasks is not None and tasks >= config.recycle_after_tasks:
                return _EXIT_RECYCLE
        return _EXIT_DONE
    finally:
        worker.close()
        os.close(report_fd)


def _wait_for_work(worker: WorkflowWorker, delay_s: float, token: CancellationToken) -> None:
    """Idle for up to ``delay_s``, returning early when the store says work is claimable
    (PostgreSQL: a NOTIFY or a due time; SQLite: its poll) or the token is cancelled.

    A signal cannot interrupt a blocking ``wait_for_work`` (the handler only cancels the
    token and the wait resumes), so the wait runs in slices of at most
    ``_IDLE_WAIT_SLICE_S`` with the token checked between them: SIGTERM stops an idle
    child within one slice rather than after up to ``max_backoff``. Work that arrives
    between two slices is not missed: each slice looks for due work before it sleeps.
    """
    deadline = time.monotonic() + delay_s
    while not token.cancelled:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            return
        if worker.store.wait_for_work(timedelta(seconds=min(remaining_s, _IDLE_WAIT_SLICE_S))):
            return
