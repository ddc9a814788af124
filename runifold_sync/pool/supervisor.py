"""``WorkflowSupervisor``: a parent process that forks a bounded pool of workers.

The parent holds no store connection and starts no thread, so nothing crosses a fork:
each child calls the worker factory after it starts and opens its own store. ``run()``
refuses to fork from a process that has a store open or a worker's threads running
(:class:`ForkUnsafe`): every child would inherit them, and a fork while a thread holds a
lock inside SQLite or libpq leaves it held in the child, which hangs. Each child runs the
worker loop, :meth:`WorkflowWorker.run`, and reports each outcome kind over a pipe,
which the parent reads ten times a second (and reaps dead children as often). The loop is
the worker's: idle children wait in the store's ``wait_for_work`` (woken by NOTIFY on
PostgreSQL) for up to the config's backoff, and a cycle that fails on an unreachable
store is retried after ``max_backoff`` in the same child. Shutdown (the token, SIGINT or
SIGTERM) reaches children as SIGTERM, which only cancels their token: a started cycle
finishes its lease protocol before the child exits (its completion claiming no next
task), an idle one stops within ``IDLE_WAIT_SLICE_S``, and one still running after
``shutdown_grace`` is SIGKILLed, its task claimed again once its lease expires.

A child that dies (SIGKILL, the OOM killer, a crash) cannot hand its leases back, but its
parent knows at once that it is gone: the child forked in its slot hands them back
(``store.hand_back_dead_leases``, fenced by their tokens and the dead worker's id) before
it claims anything, so its tasks are claimable within a second rather than a lease. The
new child is a new incarnation, ``<base>-<slot>.<n>`` (the first is ``<base>-<slot>``), in
the worker registry and the history, so what the dead one held is never taken for what
the new one runs. A child tells its parent once it is ready (its worker built, its store
answering, the leases handed back); one that dies before that, quickly, five times in a
row, stops the pool (an app or store that cannot start is not fixed by forking it again),
except when it exited because the store did not answer once the pool had reached it (an
outage, a server out of connection slots): that child is forked again with a growing
delay until the store answers, the running children carrying on meanwhile.

A child whose supervisor dies (SIGKILL) learns it at once (the kernel's parent-death
signal, on Linux, or its next report failing): it takes no new task, hands its running
task back at the task's next step boundary and its other leases with it, and exits
quietly. The first child of slot 0 also watches for ready work that no live worker can
claim and logs it (``pool/stranded_work.py``).

A step or effect body cannot be interrupted from inside, so a body with a timeout is
enforced from here: while one runs, its child reports its deadline on the same pipe
(``time.monotonic()``, which parent and child share), and the parent SIGKILLs a child
still in it at the deadline and starts another in its slot, running or stopping. The
child's heartbeat stopped extending that task's lease at the deadline, and the next child
hands it back, so another worker claims it and counts the attempt (``timeouts.py``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import selectors
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType

import attrs

from ..errors import ForkUnsafe, InvalidArgument, StoreNotWritable, StoreUnavailable, WorkerIdInUse
from ..model import crashpoints, validate
from ..model.cancellation import CancellationToken
from ..model.values import WorkerId
from ..store.base import WorkflowStore, open_here
from ..worker.idle_backoff import DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF
from ..worker.settings import seconds
from ..worker.worker import WorkflowWorker
from .preflight import check_ids_free
from .stranded_work import StrandedWork

log = logging.getLogger("runifold_sync.pool.supervisor")

_EXIT_DONE = 0
_EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the store did not answer as the child started
_EXIT_CRASHED = 70
_EXIT_RECYCLE = 75
_EXIT_ID_IN_USE = 76  # its worker id is live in another process; the pool stops
_EXIT_NOT_WRITABLE = 78  # EX_CONFIG: the store refuses this worker's writes; the pool stops
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# Sent to a child by the kernel when its supervisor dies (Linux, PR_SET_PDEATHSIG).
_PARENT_GONE_SIGNAL = signal.SIGHUP
_FATAL = "!"  # a report line that starts so is why a child stopped for good
_DEADLINE = "@"  # "@<monotonic deadline>" of the body it runs; "@" alone: none runs
_READY = "+"  # the child built its worker, its store answers, its slot's leases are back
QUICK_CRASH_S = 10.0  # a child that dies sooner than this after starting counts as crash-looping
# Quick deaths in a row of one slot's children, each before it was ready, that stop the
# pool: a worker that cannot start (its app broken, its store misnamed) is not fixed by
# forking it again.
MAX_START_FAILURES = 5
# A slot's incarnations are numbered up to this, then from 1 again: ``<base>-<slot>.<n>``.
MAX_GENERATION = 999


@attrs.frozen
class PoolSettings:
    """How a pool runs its workers, each setting checked where it is made
    (:class:`InvalidArgument` naming it and the value).

    ``concurrency`` is the number of worker processes: it bounds claim-and-execute cycles
    on this host only, and is no substitute for tenant admission or pool limits. Idle
    children wait for work between ``min_backoff`` and ``max_backoff`` (see
    ``WorkflowWorker.run``), and a cycle that failed on the store waits ``max_backoff``.
    After a stop, a child may finish its cycle for ``shutdown_grace`` before it is killed.
    With ``recycle_after_tasks`` each child is replaced by a fresh process after running
    that many tasks. ``WorkflowSupervisorConfig`` is another name for this class, and its
    ``with_*`` methods build a changed copy: ``WorkflowSupervisorConfig(8).with_backoff(...)``."""

    concurrency: int = validate.field(validate.count, 1)
    min_backoff: timedelta = validate.field(validate.positive_duration, DEFAULT_MIN_BACKOFF)
    max_backoff: timedelta = validate.field(validate.positive_duration, DEFAULT_MAX_BACKOFF)
    shutdown_grace: timedelta = validate.field(validate.positive_duration, timedelta(seconds=60))
    recycle_after_tasks: int | None = validate.field(validate.optional(validate.count), None)

    def __attrs_post_init__(self) -> None:
        if self.min_backoff > self.max_backoff:
            raise InvalidArgument(
                f"min_backoff {seconds(self.min_backoff)} is above max_backoff {seconds(self.max_backoff)}"
            )

    def with_backoff(self, minimum: timedelta, maximum: timedelta) -> PoolSettings:
        """Idle children wait between ``minimum`` and ``maximum`` (see ``WorkflowWorker.run``)."""
        return attrs.evolve(self, min_backoff=minimum, max_backoff=maximum)

    def with_shutdown_grace(self, grace: timedelta) -> PoolSettings:
        return attrs.evolve(self, shutdown_grace=grace)

    def with_recycling(self, tasks: int) -> PoolSettings:
        """Replace each child with a fresh process after it has run ``tasks`` tasks."""
        return attrs.evolve(self, recycle_after_tasks=tasks)


# The seed's name for the pool's settings, built as ``WorkflowSupervisorConfig(8)``.
WorkflowSupervisorConfig = PoolSettings


@attrs.frozen
class SupervisorReport:
    """What the children reported, one line per cycle over their pipes, by worker id (a
    slot's incarnations each under their own). A child killed between a commit and its
    report takes that count with it; the store's task states, not these counts, are the
    record of what finished."""

    outcomes: dict[str, int]
    per_worker: dict[str, dict[str, int]]
    restarts: int
    recycled: int
    stopped_by: str | None = None  # why the pool stopped on its own (a store refusing writes)
    timed_out: int = 0  # of the restarts, children killed for running a body past its timeout

    def summary(self) -> str:
        """One line for a person: what the commands that run a pool print as it stops."""
        text = f"stopped. outcomes: {self.outcomes}; restarts: {self.restarts}; recycled: {self.recycled}"
        if self.timed_out:
            text += f" ({self.timed_out} of the restarts killed past a step's timeout)"
        return text


_WORKER_ID_MAX = 128  # characters (WorkerId.parse)


def check_base_id(base_id: object, concurrency: int, field: str = "base_id") -> str:
    """``base_id`` itself, checked where the supervisor is made (and by ``run`` for its
    ``--worker-id``, the ``field`` named). Its children's worker ids are
    ``<base_id>-<slot>``, and ``<base_id>-<slot>.<n>`` for those started after a child
    died: ``base_id`` is good exactly when the longest of them parses, but a refusal of
    that id (``'bad id-1.999'``, under "worker id") would name neither the argument
    nor the value given."""
    longest = f"-{concurrency - 1}.{MAX_GENERATION}"
    if isinstance(base_id, str):
        try:
            WorkerId.parse(f"{base_id}{longest}")
            return base_id
        except InvalidArgument:
            pass
    room = _WORKER_ID_MAX - len(longest)
    raise InvalidArgument(
        f"{field} must be 1-{room} characters of letters, digits and ._:@- starting with a "
        f"letter or digit (its workers are <{field}>-<slot>[.<n>], at most {_WORKER_ID_MAX} "
        f"characters for {concurrency} slots), got {validate.shown(base_id)}"
    )


def incarnation_id(base_id: str, slot: int, generation: int) -> WorkerId:
    """The worker id of a slot's ``generation``-th process (0: the first)."""
    return WorkerId.parse(f"{base_id}-{slot}" + (f".{generation}" if generation else ""))


class WorkflowSupervisor:
    def __init__(
        self,
        worker_factory: Callable[[WorkerId], WorkflowWorker],
        config: PoolSettings,
        *,
        base_id: str = "worker",
    ) -> None:
        if not callable(worker_factory):
            validate.refuse("worker_factory", "callable", worker_factory)
        if not isinstance(config, PoolSettings):
            validate.refuse("config", "a PoolSettings (WorkflowSupervisorConfig)", config)
        self._factory = worker_factory
        self._config = config
        self._base_id = check_base_id(base_id, config.concurrency)

    def run(self, token: CancellationToken, *, tend: Callable[[], None] | None = None) -> SupervisorReport:
        """Run the pool until ``token`` is cancelled (or SIGINT/SIGTERM arrives in the
        main thread), then wait for children to finish their started cycles.

        Call it from a process with no store open and no worker running (fork first, or
        close them): that is refused with :class:`ForkUnsafe`. Threads of your own must
        not be inside SQLite or libpq either (a lock held at the fork hangs the child).

        A child whose store refuses its writes (:class:`StoreNotWritable`) stops the
        whole pool, since every child shares that store, and so do ``MAX_START_FAILURES``
        children of one slot in a row that die within ``QUICK_CRASH_S`` of starting,
        before they were ready: the report's ``stopped_by`` says why (also when a stop
        came while a slot kept failing). A first child whose worker id is live in another
        process (a pool started twice under one ``base_id``) stops the pool too, and
        ``run`` then raises :class:`WorkerIdInUse`. ``tend`` is called on each pass of the
        loop (ten times a second) until the stop: this process starts no thread, so a
        process started beside the pool is watched from here
        (``sidecar.KeptProcess.tend``); it must return at once."""
        _check_fork_safe()
        pool = _Pool([_Slot(n) for n in range(self._config.concurrency)])
        selector = selectors.DefaultSelector()
        with _stop_signals(token):
            for slot in pool.slots:
                self._spawn(slot, pool.children, selector)
            while pool.children or any(slot.respawn_at is not None for slot in pool.slots):
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
                for slot in pool.slots:
                    if slot.respawn_at is not None and time.monotonic() >= slot.respawn_at:
                        slot.respawn_at = None
                        self._spawn(slot, pool.children, selector)
        selector.close()
        if pool.id_in_use is not None:
            raise WorkerIdInUse(pool.id_in_use)
        return pool.report(self._base_id)

    def _exited(self, pool: _Pool, pid: int, child: _Child, code: int, stopping: bool) -> None:
        """Count a child's exit and settle what follows: its slot respawned (after a
        growing delay when it died before it was ready, or could not reach the store),
        or the whole pool stopped. A child that died once ready may have held leases:
        the slot's next child hands them back, under an id of its own."""
        slot = child.slot
        if code == _EXIT_RECYCLE:
            pool.recycled += 1
        elif code == _EXIT_NOT_WRITABLE:
            pool.stop(child.fatal or f"worker {child.worker_id}: the store refused its writes", child)
        elif code == _EXIT_ID_IN_USE:
            pool.id_in_use = child.fatal or f"worker id {child.worker_id} is live in another process"
            pool.stop(pool.id_in_use, child)
        elif child.ready and code != _EXIT_DONE:  # it may have held leases: the next child hands them back
            slot.dead.append(_Dead(child.worker_id, pid, _describe_exit(code)))
            slot.generation = slot.generation % MAX_GENERATION + 1
        if stopping or pool.stopped_by is not None:
            return
        if code == _EXIT_RECYCLE:
            slot.respawn_at = time.monotonic()
            return
        pool.restarts += 1
        if code == _EXIT_UNAVAILABLE and pool.reached_store:  # an outage, not a broken start
            slot.unavailable += 1
            delay_s = self._respawn_delay_s(slot.unavailable)
            _log_unavailable(child, slot.unavailable, delay_s)
            slot.respawn_at = time.monotonic() + delay_s
            return
        delay_s = 0.0
        if child.timed_out:  # killed here, having started well: no crash at start
            pool.timed_out += 1
        elif not child.ready:
            quick = time.monotonic() - child.started < QUICK_CRASH_S
            slot.failed_starts = slot.failed_starts + 1 if quick else 0
            if slot.failed_starts >= MAX_START_FAILURES:
                pool.stop(
                    f"worker {child.worker_id} exited with {code} within {QUICK_CRASH_S:.0f} s of starting "
                    f"{slot.failed_starts} times in a row (its log above says why)",
                    child,
                )
                return
            delay_s = self._respawn_delay_s(slot.failed_starts)
        log.warning(
            "worker %s (pid %d) %s%s; starting worker %s in its place%s",
            child.worker_id,
            pid,
            _describe_exit(code),
            f" ({child.fatal})" if child.fatal else "",
            self._next_id(slot),
            ", which hands back the tasks it held" if slot.dead else "",
            extra={"worker_id": child.worker_id},
        )
        slot.respawn_at = time.monotonic() + delay_s

    def _next_id(self, slot: _Slot) -> WorkerId:
        return incarnation_id(self._base_id, slot.index, slot.generation)

    def _respawn_delay_s(self, in_a_row: int) -> float:
        """A child that keeps dying at start (store down, broken app) is restarted with a
        growing delay instead of in a tight fork loop."""
        if in_a_row == 0:
            return 0.0
        delay_s: float = 0.1 * 2.0 ** (in_a_row - 1)
        return min(delay_s, self._config.max_backoff.total_seconds())

    def _spawn(self, slot: _Slot, children: dict[int, _Child], selector: selectors.BaseSelector) -> None:
        start = _Start(self._next_id(slot), tuple(slot.dead), not slot.checked, slot.index == 0, os.getpid())
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
                code = _child_main(self._factory, start, self._config, write_fd, unblocked)
            except BaseException:
                log.exception(
                    "worker %s crashed", start.worker_id, extra={"worker_id": start.worker_id.value}
                )
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        os.close(write_fd)
        child = _Child(slot, start.worker_id.value, read_fd, start.dead)
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


def _check_fork_safe() -> None:
    """Refuse to fork beside what must not cross a fork: stores open in this process (a
    PostgreSQL store's pool and listener threads, any store's connections) and the threads
    of a worker built here."""
    stores = open_here()
    threads = sorted(
        t.name
        for t in threading.enumerate()
        if t is not threading.current_thread() and t.is_alive() and t.name.startswith("runifold-")
    )
    if not stores and not threads:
        return
    held = []
    if stores:
        held.append(f"{len(stores)} open store(s) ({', '.join(sorted({type(s).__name__ for s in stores}))})")
    if threads:
        held.append(f"runifold threads {', '.join(threads)}")
    raise ForkUnsafe(
        f"WorkflowSupervisor.run must be called from a process with no store open and no worker "
        f"running, since each child is forked from it; this process has {' and '.join(held)}. "
        "Close them first (store.close(), worker.close()), or start the pool from a fresh process; "
        "each child opens its own store in the worker factory"
    )


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with {code}"


def _log_unavailable(child: _Child, in_a_row: int, delay_s: float) -> None:
    """The first exit of a run of them as a warning, the rest at info level: an outage
    is said once, not every few seconds per slot."""
    level = logging.WARNING if in_a_row == 1 else logging.INFO
    log.log(
        level,
        "worker %s could not reach the store as it started (%s); starting it again in %.1f s, "
        "and with a growing delay until the store answers (the other workers carry on)",
        child.worker_id,
        child.fatal or "store unavailable",
        delay_s,
        extra={"worker_id": child.worker_id},
    )


@attrs.frozen
class _Dead:
    """A child that died once ready: what its slot's next child hands back."""

    worker_id: str
    pid: int
    how: str  # "was killed by SIGKILL", "exited with 70"


@attrs.frozen
class _Start:
    """What a child is told as it is forked."""

    worker_id: WorkerId
    dead: tuple[_Dead, ...]  # its slot's dead incarnations, whose leases it hands back
    check_id: bool  # the slot's first start in this run: refuse an id live elsewhere
    watch_stranded: bool  # log ready work no live worker can claim (one child per pool)
    parent_pid: int


@attrs.define
class _Slot:
    """One of the pool's places and what its children left it."""

    index: int
    generation: int = 0  # of the next child: its id is <base>-<index>[.<generation>]
    checked: bool = False  # a child of it was ready: its id was checked
    dead: list[_Dead] = attrs.Factory(list)  # not yet handed back by a ready child
    failed_starts: int = 0  # quick deaths in a row before ready
    unavailable: int = 0  # exits in a row because the store did not answer
    respawn_at: float | None = None  # monotonic time its next child is due

    def ready(self, child: _Child) -> bool:
        """A child of this slot is ready; True when it comes after store failures."""
        self.checked = True
        self.dead = [d for d in self.dead if d not in child.handing_back]
        self.failed_starts = 0
        recovered = self.unavailable > 0
        self.unavailable = 0
        return recovered


@attrs.define
class _Pool:
    """What the supervisor keeps while its pool runs."""

    slots: list[_Slot]
    counts: dict[str, Counter[str]] = attrs.Factory(dict)  # outcome kinds per worker id
    children: dict[int, _Child] = attrs.Factory(dict)  # by pid
    restarts: int = 0
    recycled: int = 0
    timed_out: int = 0
    stopped_by: str | None = None
    id_in_use: str | None = None  # a first child's id was live elsewhere: run() raises
    failing_at_stop: dict[int, int] = attrs.Factory(dict)  # slot -> quick deaths in a row

    @property
    def reached_store(self) -> bool:
        """A child of this pool was ready: its store answered once."""
        return any(slot.checked for slot in self.slots)

    def stop(self, reason: str, child: _Child) -> None:
        self.stopped_by = reason
        log.error("%s; stopping the pool", reason, extra={"worker_id": child.worker_id})

    def failing(self) -> dict[int, int]:
        """The slots in a run of failed starts, and its length: waiting to be forked again
        after one, or running a child forked since one that is not ready yet."""
        return {slot.index: slot.failed_starts for slot in self.slots if slot.failed_starts}

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
    slot: _Slot
    worker_id: str
    fd: int
    handing_back: tuple[_Dead, ...]  # its slot's dead, as they were when it was forked
    started: float = attrs.Factory(time.monotonic)
    partial: bytes = b""
    ready: bool = False  # it said so: worker built, store answering, leases handed back
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
            elif line == _READY:
                self.ready = True
                if self.slot.ready(self):
                    log.warning(
                        "worker %s started: the store answers again",
                        self.worker_id,
                        extra={"worker_id": self.worker_id},
                    )
            else:
                counts.setdefault(self.worker_id, Counter())[line] += 1


def _kill_overdue(children: dict[int, _Child]) -> None:
    """SIGKILL each child still running a body past its deadline; it is reaped and
    replaced like any child that died, and the replacement hands its task back (the
    lease no longer extended past the deadline runs out first if it cannot)."""
    now = time.monotonic()
    for pid, child in children.items():
        if child.deadline is not None and now >= child.deadline and not child.timed_out:
            log.error(
                "worker %s (pid %d) runs a step past its timeout; killing it (another worker "
                "claims its task once it is handed back, and counts the attempt)",
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


class _Orphaned:
    """Notices that the supervisor is gone (the kernel's parent-death signal, or a report
    that cannot be written) and stops the child quietly: no new task, the running one
    handed back at its next step boundary, the others as the worker loop ends."""

    def __init__(self, parent_pid: int, token: CancellationToken, worker_id: WorkerId) -> None:
        self._parent_pid = parent_pid
        self._token = token
        self._worker_id = worker_id
        self.worker: WorkflowWorker | None = None
        self.gone = False

    def watch(self) -> None:
        """Ask the kernel for the signal when the parent dies (Linux), then check it did
        not die already."""
        signal.signal(_PARENT_GONE_SIGNAL, self._signalled)
        if sys.platform.startswith("linux"):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(_PARENT_GONE_SIGNAL), 0, 0, 0)
        if os.getppid() != self._parent_pid:
            self.parent_gone()

    def _signalled(self, _signum: int, _frame: FrameType | None) -> None:
        if os.getppid() != self._parent_pid:  # a hangup while the parent lives is not its death
            self.parent_gone()

    def parent_gone(self) -> None:
        if self.gone:
            return
        self.gone = True
        reason = f"the supervisor (pid {self._parent_pid}) of worker {self._worker_id} is gone"
        log.warning(
            "%s: handing back its task at the next step boundary and stopping",
            reason,
            extra={"worker_id": self._worker_id.value},
        )
        self._token.cancel()
        if self.worker is not None:
            self.worker.hand_back_at_boundary(f"{reason}; handed back unfinished")

    def write(self, fd: int, line: str) -> None:
        """Report ``line`` to the parent; a parent that is gone stops this child."""
        if self.gone:
            return
        try:
            os.write(fd, f"{line}\n".encode())
        except OSError:
            self.parent_gone()


def _child_main(
    factory: Callable[[WorkerId], WorkflowWorker],
    start: _Start,
    config: PoolSettings,
    report_fd: int,
    signal_mask: set[int | signal.Signals],
) -> int:
    """A child's life: build its worker (which opens its own store), hand back what its
    slot's dead children held, say it is ready, run the worker loop until SIGTERM,
    recycling or its parent's death, report each outcome kind to the parent, and close.
    A store that refuses the worker's writes ends it with the reason reported; one that
    does not answer before the child is ready ends it for its parent to try again."""
    token = CancellationToken()
    signal.signal(signal.SIGTERM, lambda _s, _f: token.cancel())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into SIGTERM
    orphaned = _Orphaned(start.parent_pid, token, start.worker_id)
    orphaned.watch()
    signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)  # a SIGTERM held since the fork lands now

    def deadline(at: float | None) -> None:
        orphaned.write(report_fd, f"{_DEADLINE}{'' if at is None else repr(at)}")

    worker: WorkflowWorker | None = None
    stranded: StrandedWork | None = None
    ready = False
    try:
        worker = factory(start.worker_id)
        orphaned.worker = worker
        if orphaned.gone:
            worker.hand_back_at_boundary("the supervisor is gone")
        worker.report_deadlines(deadline)
        if start.check_id:
            check_ids_free(worker.store, [start.worker_id.value], worker.settings.heartbeat_interval)
        for dead in start.dead:
            hand_back_dead_worker(worker.store, dead.worker_id, dead.pid, dead.how)
        orphaned.write(report_fd, _READY)
        ready = True
        if start.watch_stranded:
            stranded = StrandedWork(worker.store, worker.settings.heartbeat_interval * 3)
        done = worker.run(
            token,
            max_tasks=config.recycle_after_tasks,
            min_backoff=config.min_backoff,
            max_backoff=config.max_backoff,
            on_outcome=lambda outcome: orphaned.write(report_fd, outcome.kind),
        )
        return _EXIT_RECYCLE if done.reached_max_tasks else _EXIT_DONE
    except WorkerIdInUse as exc:
        orphaned.write(report_fd, f"{_FATAL}{' '.join(str(exc).split())}")
        return _EXIT_ID_IN_USE
    except StoreNotWritable as exc:
        orphaned.write(report_fd, f"{_FATAL}{' '.join(f'worker {start.worker_id}: {exc}'.split())}")
        return _EXIT_NOT_WRITABLE
    except StoreUnavailable as exc:
        if ready:  # the worker loop survives outages; this is not one of its starts
            raise
        orphaned.write(report_fd, f"{_FATAL}{' '.join(str(exc).split())}")
        return _EXIT_UNAVAILABLE
    finally:
        if stranded is not None:
            stranded.close()
        if worker is not None:
            worker.close()
        os.close(report_fd)


def hand_back_dead_worker(store: WorkflowStore, worker_id: str, pid: int, how: str) -> list[str]:
    """Hand back what worker ``worker_id``, whose process ``pid`` is known to be gone
    (``how``: "was killed by SIGKILL"), held, and mark it stopped in the registry: what
    a pool's child does for its slot's dead predecessors before it claims anything.
    Returns the ids of the tasks handed back."""
    dead = WorkerId.parse(worker_id)
    leases = store.leases_held_by(dead)
    handed: list[str] = []
    if leases:
        reason = f"worker {worker_id} (pid {pid}) {how}; its supervisor handed its lease back"
        with crashpoints.transition("hand_back_dead"):
            handed = store.hand_back_dead_leases(dead, leases, reason=reason)
    if handed:
        log.warning(
            "worker %s (pid %d) %s holding %d task(s); handed back, claimable now: %s",
            worker_id,
            pid,
            how,
            len(handed),
            ", ".join(handed),
            extra={"worker_id": worker_id},
        )
    store.worker_stopped(dead, pid)
    return handed
