"""``WorkflowSupervisor``: a parent process that forks a bounded pool of workers.

The parent holds no store connection and starts no thread, so nothing crosses a fork:
each child calls the worker factory after it starts and opens its own store. (The
process that calls ``run()`` should not have other threads inside SQLite or libpq
either: a fork while one holds a lock there leaves it held in the child, which hangs.)
Each child runs the worker loop, :meth:`WorkflowWorker.run`, and reports each outcome
kind over a pipe, which the parent reads ten times a second (and reaps dead children as
often). The loop is the worker's: idle children wait in the store's ``wait_for_work``
(woken by NOTIFY on PostgreSQL) for up to the config's backoff, and a cycle that fails on
an unreachable store is retried after ``max_backoff`` in the same child. Shutdown (the
token, SIGINT or SIGTERM) reaches children as SIGTERM, which only cancels their token: a
started cycle finishes its lease protocol before the child exits (its completion claiming
no next task), an idle one stops within ``IDLE_WAIT_SLICE_S``, and one still running
after ``shutdown_grace`` is SIGKILLed, its task claimed again once its lease expires.

A step or effect body cannot be interrupted from inside, so a body with a timeout is
enforced from here: while one runs, its child reports its deadline on the same pipe
(``time.monotonic()``, which parent and child share), and the parent SIGKILLs a child
still in it at the deadline and starts another in its slot, running or stopping. The
child's heartbeat stopped extending that task's lease at the deadline, so another worker
claims it one lease later and counts the attempt (``timeouts.py``).
"""

from __future__ import annotations

import logging
import os
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

from .cancellation import CancellationToken
from .errors import InvalidArgument, StoreNotWritable
from .idle_backoff import DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF, check_backoff_bounds
from .models import WorkerId, check_count, check_positive_timedelta
from .outcomes import RunOutcome
from .worker import WorkflowWorker

log = logging.getLogger("runifold_sync.supervisor")

_EXIT_DONE = 0
_EXIT_RECYCLE = 75
_EXIT_CRASHED = 70
_EXIT_NOT_WRITABLE = 78  # EX_CONFIG: the store refuses this worker's writes; the pool stops
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_FATAL = "!"  # a report line that starts so is why a child stopped for good
_DEADLINE = "@"  # "@<monotonic deadline>" of the body it runs; "@" alone: none runs
QUICK_CRASH_S = 10.0  # a child that dies sooner than this after starting counts as crash-looping
# Quick deaths in a row of one slot's children that stop the pool: a worker that cannot
# start (its store gone, its app broken) is not fixed by forking it again.
MAX_START_FAILURES = 5


def _check_concurrency(_inst: object, _attr: object, value: int) -> None:
    check_count("concurrency", value)


def _check_backoff(inst: WorkflowSupervisorConfig, _attr: object, _value: timedelta) -> None:
    check_backoff_bounds(inst.min_backoff, inst.max_backoff)


def _check_grace(_inst: object, _attr: object, value: timedelta) -> None:
    check_positive_timedelta("shutdown grace", value)


def _check_recycling(_inst: object, _attr: object, value: int | None) -> None:
    if value is not None:
        check_count("recycle_after_tasks", value)


@attrs.frozen
class WorkflowSupervisorConfig:
    """``concurrency`` is the number of worker processes. It bounds claim-and-execute
    cycles on this host only; it is no substitute for tenant admission or pool limits."""

    concurrency: int = attrs.field(validator=_check_concurrency)
    min_backoff: timedelta = attrs.field(default=DEFAULT_MIN_BACKOFF)
    max_backoff: timedelta = attrs.field(default=DEFAULT_MAX_BACKOFF, validator=_check_backoff)
    shutdown_grace: timedelta = attrs.field(default=timedelta(seconds=60), validator=_check_grace)
    recycle_after_tasks: int | None = attrs.field(default=None, validator=_check_recycling)

    def with_backoff(self, minimum: timedelta, maximum: timedelta) -> WorkflowSupervisorConfig:
        """Idle children wait between ``minimum`` and ``maximum`` (see ``WorkflowWorker.run``)."""
        return attrs.evolve(self, min_backoff=minimum, max_backoff=maximum)

    def with_shutdown_grace(self, grace: timedelta) -> WorkflowSupervisorConfig:
        return attrs.evolve(self, shutdown_grace=grace)

    def with_recycling(self, tasks: int) -> WorkflowSupervisorConfig:
        """Replace each child with a fresh process after it has run ``tasks`` tasks."""
        return attrs.evolve(self, recycle_after_tasks=tasks)


@attrs.frozen
class SupervisorReport:
    """What the children reported, one line per cycle over their pipes. A child killed
    between a commit and its report takes that count with it; the store's task states,
    not these counts, are the record of what finished."""

    outcomes: dict[str, int]
    per_worker: dict[str, dict[str, int]]
    restarts: int
    recycled: int
    stopped_by: str | None = None  # why the pool stopped on its own (a store refusing writes)
    timed_out: int = 0  # of the restarts, children killed for running a body past its timeout


_WORKER_ID_MAX = 128  # characters (WorkerId.parse)


def check_base_id(base_id: object, concurrency: int, field: str = "base_id") -> str:
    """``base_id`` itself, checked where the supervisor is made (and by ``run`` for its
    ``--worker-id``, the ``field`` named). Its children's worker ids are
    ``<base_id>-<slot>``: ``base_id`` is good exactly when the longest of them parses, but
    a refusal of that id (``'bad id-1'``, under "worker id") would name neither the
    argument nor the value given."""
    if isinstance(base_id, str):
        try:
            WorkerId.parse(f"{base_id}-{concurrency - 1}")
            return base_id
        except InvalidArgument:
            pass
    room = _WORKER_ID_MAX - len(f"-{concurrency - 1}")
    raise InvalidArgument(
        f"{field} must be 1-{room} characters of letters, digits and ._:@- starting with a "
        f"letter or digit (its workers are <{field}>-<slot>, at most {_WORKER_ID_MAX} "
        f"characters for {concurrency} slots), got {base_id!r}"
    )


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
        self._factory = worker_factory
        self._config = config
        self._base_id = check_base_id(base_id, config.concurrency)

    def run(self, token: CancellationToken, *, tend: Callable[[], None] | None = None) -> SupervisorReport:
        """Run the pool until ``token`` is cancelled (or SIGINT/SIGTERM arrives in the
        main thread), then wait for children to finish their started cycles. A child
        whose store refuses its writes (:class:`StoreNotWritable`) stops the whole pool,
        since every child shares that store, and so do ``MAX_START_FAILURES`` children of
        one slot in a row that die within ``QUICK_CRASH_S`` of starting: the report's
        ``stopped_by`` says why (also when a stop came while a slot kept failing).
        ``tend`` is called on each pass of the loop (ten times a second) until the stop:
        this process starts no thread, so a process started beside the pool is watched
        from here (``sidecar.KeptProcess.tend``); it must return at once."""
        pool = _Pool()
        selector = selectors.DefaultSelector()
        with _stop_signals(token):
            for slot in range(self._config.concurrency):
                self._spawn(slot, pool.children, selector, crashes=0)
            while pool.children or pool.respawn_at:
                if token.cancelled or pool.stopped_by is not None:
                    pool.failing_at_stop = pool.failing()
                    pool.recycled += self._stop_children(pool.children, selector, pool.counts)
                    break
                # Reports are read in batches: waking for each one cost the parent about
                # 25 us of CPU per task, on the cores its busy children share.
                token.wait(0.1)
                self._read_reports(selector, pool.counts, timeout_s=0)
                _kill_overdue(pool.children)
                if tend is not None:
                    tend()
                for pid, child, status in _reap(pool.children):
                    self._drain(child, selector, pool.counts)
                    self._exited(pool, pid, child, os.waitstatus_to_exitcode(status), token.cancelled)
                for slot, (due, crashes) in list(pool.respawn_at.items()):
                    if time.monotonic() >= due:
                        del pool.respawn_at[slot]
                        self._spawn(slot, pool.children, selector, crashes=crashes)
        selector.close()
        return pool.report(self._base_id)

    def _exited(self, pool: _Pool, pid: int, child: _Child, code: int, stopping: bool) -> None:
        """Count a child's exit and settle what follows: its slot respawned (after a
        growing delay when it died soon after starting), or the whole pool stopped."""
        if code == _EXIT_RECYCLE:
            pool.recycled += 1
        elif code == _EXIT_NOT_WRITABLE:
            pool.stop(child.fatal or f"worker {child.worker_id}: the store refused its writes", child)
        if stopping or pool.stopped_by is not None:
            return
        crashes = 0
        if child.timed_out:  # killed here, having started well: no crash at start
            pool.restarts += 1
            pool.timed_out += 1
        elif code != _EXIT_RECYCLE:
            pool.restarts += 1
            crashes = child.crashes + 1 if time.monotonic() - child.started < QUICK_CRASH_S else 0
            if crashes >= MAX_START_FAILURES:
                pool.stop(
                    f"worker {child.worker_id} exited with {code} within {QUICK_CRASH_S:.0f} s of starting "
                    f"{crashes} times in a row (its log above says why)",
                    child,
                )
                return
            log.warning(
                "worker %s (pid %d) exited with %d; restarting",
                child.worker_id,
                pid,
                code,
                extra={"worker_id": child.worker_id},
            )
        pool.respawn_at[child.slot] = (time.monotonic() + self._respawn_delay_s(crashes), crashes)

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
        # The stop signals wait (blocked) until the child has its own handlers: one that
        # came before would run the parent's handler, cancelling the parent's token as
        # copied into the child, and the child would run on until SIGKILLed.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # child: never returns into the parent's stack
            code = _EXIT_CRASHED
            try:
                os.close(read_fd)
                code = _child_main(self._factory, worker_id, self._config, write_fd, unblocked)
            except BaseException:
                log.exception("worker %s crashed", worker_id, extra={"worker_id": worker_id.value})
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
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
            _kill_overdue(children)
            for _pid, child, status in _reap(children):
                self._drain(child, selector, counts)
                recycled += os.waitstatus_to_exitcode(status) == _EXIT_RECYCLE
        for pid, child in list(children.items()):
            log.error(
                "worker %s did not stop within the shutdown grace of %g s; killing it "
                "(its task is claimed again once its lease runs out)",
                child.worker_id,
                self._config.shutdown_grace.total_seconds(),
                extra={"worker_id": child.worker_id},
            )
            _signal(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._drain(child, selector, counts)
            del children[pid]
        return recycled


@attrs.define
class _Pool:
    """What the supervisor keeps while its pool runs."""

    counts: dict[str, Counter[str]] = attrs.Factory(dict)  # outcome kinds per worker id
    children: dict[int, _Child] = attrs.Factory(dict)  # by pid
    respawn_at: dict[int, tuple[float, int]] = attrs.Factory(dict)  # slot -> (monotonic due, quick crashes)
    restarts: int = 0
    recycled: int = 0
    timed_out: int = 0
    stopped_by: str | None = None
    failing_at_stop: dict[int, int] = attrs.Factory(dict)  # slot -> quick deaths in a row

    def stop(self, reason: str, child: _Child) -> None:
        self.stopped_by = reason
        log.error("%s; stopping the pool", reason, extra={"worker_id": child.worker_id})

    def failing(self) -> dict[int, int]:
        """The slots in a run of quick deaths, and its length: waiting to be forked again
        after one, or running a child forked since one that is not yet past
        ``QUICK_CRASH_S`` (it may well die as quickly)."""
        failing = {slot: crashes for slot, (_due, crashes) in self.respawn_at.items() if crashes}
        now = time.monotonic()
        for child in self.children.values():
            if child.crashes and now - child.started < QUICK_CRASH_S:
                failing.setdefault(child.slot, child.crashes)
        return failing

    def report(self, base_id: str) -> SupervisorReport:
        stopped_by = self.stopped_by
        if stopped_by is None and self.failing_at_stop:
            slot, crashes = min(self.failing_at_stop.items())
            stopped_by = (
                f"stopped while worker {base_id}-{slot} kept failing to start "
                f"({crashes} quick exits in a row)"
            )
        total: Counter[str] = Counter()
        for counted in self.counts.values():
            total.update(counted)
        per_worker = {wid: dict(c) for wid, c in sorted(self.counts.items())}
        return SupervisorReport(
            dict(total), per_worker, self.restarts, self.recycled, stopped_by, timed_out=self.timed_out
        )


@attrs.define
class _Child:
    slot: int
    worker_id: str
    fd: int
    crashes: int  # consecutive quick crashes of this slot before this child
    started: float = attrs.Factory(time.monotonic)
    partial: bytes = b""
    fatal: str | None = None  # why it stopped for good, as it said
    deadline: float | None = None  # monotonic deadline of the body it runs, as it said
    timed_out: bool = False  # killed for running past that deadline

    def take(self, data: bytes, counts: dict[str, Counter[str]]) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in (ln.decode() for ln in lines if ln):
            if line.startswith(_FATAL):
                self.fatal = line.removeprefix(_FATAL)
            elif line.startswith(_DEADLINE):
                told = line.removeprefix(_DEADLINE)
                self.deadline = float(told) if told else None
            else:
                counts.setdefault(self.worker_id, Counter())[line] += 1


def _kill_overdue(children: dict[int, _Child]) -> None:
    """SIGKILL each child still running a body past its deadline; it is reaped and
    replaced like any child that died, and its task is claimed again once its lease,
    no longer extended, runs out."""
    now = time.monotonic()
    for pid, child in children.items():
        if child.deadline is not None and now >= child.deadline and not child.timed_out:
            log.error(
                "worker %s (pid %d) runs a step past its timeout; killing it (another worker "
                "claims its task once the lease runs out, and counts the attempt)",
                child.worker_id,
                pid,
                extra={"worker_id": child.worker_id},
            )
            child.timed_out = True
            _signal(pid, signal.SIGKILL)


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

    previous = {s: signal.signal(s, handler) for s in _STOP_SIGNALS}
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
    signal_mask: set[int | signal.Signals],
) -> int:
    """A child's life: build its worker (which opens its own store), run the worker loop
    until SIGTERM or recycling, report each outcome kind to the parent, and close. A store
    that refuses the worker's writes ends it with the reason reported."""
    token = CancellationToken()
    signal.signal(signal.SIGTERM, lambda _s, _f: token.cancel())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into SIGTERM
    signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)  # a SIGTERM held since the fork lands now

    def report(outcome: RunOutcome) -> None:
        os.write(report_fd, f"{outcome.kind}\n".encode())

    def deadline(at: float | None) -> None:
        try:
            os.write(report_fd, f"{_DEADLINE}{'' if at is None else repr(at)}\n".encode())
        except OSError:
            pass  # the parent is gone: nobody is left to kill this child, nor to tell

    try:
        worker = factory(worker_id)
        worker.report_deadlines(deadline)
        try:
            done = worker.run(
                token,
                max_tasks=config.recycle_after_tasks,
                min_backoff=config.min_backoff,
                max_backoff=config.max_backoff,
                on_outcome=report,
            )
        finally:
            worker.close()
        return _EXIT_RECYCLE if done.reached_max_tasks else _EXIT_DONE
    except StoreNotWritable as exc:
        reason = " ".join(f"worker {worker_id}: {exc}".split())
        os.write(report_fd, f"{_FATAL}{reason}\n".encode())
        return _EXIT_NOT_WRITABLE
    finally:
        os.close(report_fd)
