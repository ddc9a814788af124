"""Parallel branches and first-success races inside one task.

Branches run on a bounded thread pool inside the worker. Each has its own journal and
call ids scoped by branch, while every commit goes through the task's one checkpoint
revision sequence. After a crash the main function runs again: branches that finished
replay from their journals without running a step, unfinished ones continue.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import InvalidArgument, OutputNotSerializable, StepFailed, StoreUnavailable
from ..model import validate
from ..model.checkpoint import EntryKind, EntryStatus, JournalEntry
from ..model.codec import NotJsonable, structure, to_jsonable
from ..model.values import Budget
from ..workflow.specs import return_type
from .boundary import Boundary
from .commits import Commits
from .interrupts import (
    BranchStopped,
    CancelRequested,
    FailRequested,
    Interrupt,
    RetryRequested,
    UnknownPatch,
    Unwind,
    YieldRequested,
    uncaught,
)
from .replay import Cursor

if TYPE_CHECKING:
    from ..workflow.context import WorkflowContext

Branch = Callable[["WorkflowContext"], Any]
# A ctx for one branch: (branch key, its reserve, its stop event, the shares held by all).
Fork = Callable[[str, "Budget | None", threading.Event, Mapping[str, Budget]], "WorkflowContext"]


@attrs.frozen
class Parent:
    """What the branches of one parallel or race call need of the journal that makes
    the call: its cursor, boundary checks (and through them the claim's commits), and how
    to give a branch a ctx."""

    cursor: Cursor
    boundary: Boundary
    fork: Fork

    @property
    def commits(self) -> Commits:
        return self.boundary.commits


# When several branches are interrupted, the most consequential interruption wins (and
# of two unwinding store errors, a lost lease: see ``_Runner.worst``).
_SEVERITY: tuple[type[Interrupt], ...] = (
    Unwind,
    UnknownPatch,
    FailRequested,
    CancelRequested,
    RetryRequested,
    YieldRequested,
    BranchStopped,
)


def _check_branches(branches: Mapping[str, Branch], max_threads: int) -> None:
    if not isinstance(branches, Mapping):  # a list of functions has no names to record results by
        validate.refuse("parallel branches", "a dict of name -> function", branches)
    if not branches:
        raise InvalidArgument("parallel branches must not be empty")
    for key, fn in branches.items():
        validate.name("branch name", key)
        if "/" in key or "#" in key:
            raise InvalidArgument(f"branch name may not contain '/' or '#', got {validate.shown(key)}")
        if not callable(fn):
            validate.refuse(f"branch {key!r}", "callable with a ctx", fn)
    validate.integer("max_threads", max_threads, minimum=1)


def _check_reserve(reserve: object) -> dict[str, Budget]:
    """``parallel``'s reserve: None, or branch names -> the Budget share of each."""
    if reserve is None:
        return {}
    if not isinstance(reserve, Mapping):
        validate.refuse("reserve", "a dict of branch name -> Budget", reserve)
    for key, share in reserve.items():
        if not isinstance(share, Budget):
            validate.refuse(f"reserve of branch {key!r}", "a Budget", share)
    return dict(reserve)


def _structured(fn: Branch, raw: Any) -> Any:
    return structure(raw, return_type(fn))


def _encode(key: str, value: Any) -> Any:
    try:
        return to_jsonable(value)
    except NotJsonable as exc:
        raise FailRequested(
            f"result of branch {key!r} cannot be stored as JSON: {exc}",
            cause="not_serializable",
            error=OutputNotSerializable(key, str(exc)),
        ) from exc


class _Runner:
    """Runs branch functions on threads and collects each one's result or interruption."""

    def __init__(self, parent: Parent, call_id: str, reserve: Mapping[str, Budget]) -> None:
        self.parent = parent
        self.call_id = call_id
        self.reserve = reserve
        self.stops: dict[str, threading.Event] = {}
        # Reservations of branches that have not finished; read by unreserved branches.
        self.held = {f"{call_id}/{key}": share for key, share in reserve.items()}
        self.results: dict[str, Any] = {}
        self.interrupts: dict[str, Interrupt] = {}
        self.lock = threading.Lock()

    def run(
        self, branches: Mapping[str, Branch], max_threads: int, on_done: Callable[[str, Any], None]
    ) -> None:
        self.stops = {key: threading.Event() for key in branches}

        def body(key: str, fn: Branch) -> None:
            threading.current_thread().name = f"runifold-branch-{key}"
            full_key = f"{self.call_id}/{key}"
            branch_ctx = self.parent.fork(full_key, self.reserve.get(key), self.stops[key], self.held)
            try:
                value = _encode(key, fn(branch_ctx))
                # Recorded, and the branch's last step committed, before its share is
                # freed: a crash while its siblings run neither runs it again nor, on the
                # resumed claim, holds its share against them.
                on_done(key, value)
                self.parent.commits.commit_unsaved()
                self.held.pop(full_key, None)  # its unspent share is free for the others
            except Interrupt as interrupt:
                self._interrupted(key, interrupt)
                return
            except StoreUnavailable as exc:  # ends the cycle, as in the main function
                self._interrupted(key, Unwind(exc))
                return
            except StepFailed as failed:  # a step's final failure the branch did not catch
                self._interrupted(key, uncaught(failed))
                return
            except Exception as exc:
                failure = FailRequested(
                    f"branch {key!r} raised {type(exc).__name__}: {exc}", cause="workflow_error", error=exc
                )
                self._interrupted(key, failure)
                return
            with self.lock:
                self.results[key] = value

        with ThreadPoolExecutor(min(max_threads, len(branches))) as pool:
            # Each branch runs in a copy of this thread's context, so what is current here
            # (the cycle's span when tracing is on) is current in the branch too.
            started = [
                pool.submit(contextvars.copy_context().run, body, key, fn) for key, fn in branches.items()
            ]
            for future in started:
                future.result()

    def _interrupted(self, key: str, interrupt: Interrupt) -> None:
        with self.lock:
            self.interrupts[key] = interrupt
        if not isinstance(interrupt, BranchStopped):
            for stop in self.stops.values():  # siblings stop at their next step boundary
                stop.set()

    def worst(self, ignore: Collection[type[Interrupt]] = ()) -> Interrupt | None:
        found = [i for i in self.interrupts.values() if not isinstance(i, tuple(ignore))]
        found.sort(key=lambda i: isinstance(i, Unwind) and isinstance(i.error, StoreUnavailable))
        for kind in _SEVERITY:
            for interrupt in found:
                if isinstance(interrupt, kind):
                    return interrupt
        return None


def run_parallel(
    parent: Parent,
    branches: Mapping[str, Branch],
    reserve: Mapping[str, Budget] | None,
    max_threads: int,
) -> dict[str, Any]:
    """Every branch's result, by name; recorded when all have finished."""
    _check_branches(branches, max_threads)
    reserve = _check_reserve(reserve)
    unknown = set(reserve) - set(branches)
    if unknown:
        raise InvalidArgument(f"reserve names branches that do not exist: {sorted(unknown)}")
    entry = _start(parent, EntryKind.PARALLEL, lambda: parent.boundary.check_reservations(reserve))
    if entry.status == EntryStatus.DONE:
        return {key: _structured(fn, entry.output[key]) for key, fn in branches.items()}
    call_id = entry.call_id
    # Branches that finished before an interruption: their results are in the pending
    # entry; only the others run again, and only theirs are reserved.
    done: dict[str, Any] = dict(entry.output or {})
    runner = _Runner(parent, call_id, {k: share for k, share in reserve.items() if k not in done})

    def on_done(key: str, value: Any) -> None:
        with parent.commits.lock:
            done[key] = value
            entry.output = dict(done)
            parent.commits.defer(f"{call_id}/{key}")  # committed by the branch right after

    runner.run({k: fn for k, fn in branches.items() if k not in done}, max_threads, on_done)
    _raise(runner.worst())
    parent.cursor.finish(entry, done)
    parent.commits.commit()
    return {key: _structured(fn, done[key]) for key, fn in branches.items()}


def run_race(
    parent: Parent,
    branches: Mapping[str, Branch],
    cancel_safe: Iterable[str],
    max_threads: int,
) -> tuple[str, Any]:
    """First branch to succeed wins and is recorded at once. Losers in ``cancel_safe``
    stop at their next step boundary; the others finish and are recorded as superseded."""
    _check_branches(branches, max_threads)
    if isinstance(cancel_safe, str) or not isinstance(cancel_safe, Iterable):
        validate.refuse("cancel_safe", "a list of branch names", cancel_safe)
    safe = frozenset(cancel_safe)
    if safe - set(branches):
        raise InvalidArgument(f"cancel_safe names branches that do not exist: {sorted(safe - set(branches))}")
    entry = _start(parent, EntryKind.RACE, lambda: None)
    if entry.status == EntryStatus.DONE:
        winner = entry.output["winner"]
        return winner, _structured(branches[winner], entry.output["result"])
    call_id = entry.call_id
    decided: dict[str, Any] = dict(entry.output or {})
    runner = _Runner(parent, call_id, {})
    to_run = dict(branches)
    if "winner" in decided:  # decided before a crash: only unfinished unsafe losers go on
        to_run = {k: fn for k, fn in branches.items() if k != decided["winner"] and k not in safe}

    def on_done(key: str, value: Any) -> None:
        with runner.lock:
            first = "winner" not in decided
            if first:
                decided.update(winner=key, result=value)
        if first:
            with parent.commits.lock:
                entry.output = dict(decided)
            parent.commits.commit()  # the decision is durable before losers stop
            for loser in safe - {key}:
                runner.stops[loser].set()

    runner.run(to_run, max_threads, on_done)
    interrupt = runner.worst(ignore=() if "winner" not in decided else (FailRequested, BranchStopped))
    if "winner" not in decided:
        _raise(interrupt or FailRequested(f"every branch of {call_id} failed", cause="workflow_error"))
    if interrupt is not None and not isinstance(interrupt, BranchStopped):
        _raise(interrupt)  # a lost lease, an unreachable store or a cancel still ends it here
    decided["superseded"] = sorted(k for k in runner.results if k != decided["winner"])
    decided["cancelled"] = sorted(k for k, i in runner.interrupts.items() if isinstance(i, BranchStopped))
    parent.cursor.finish(entry, decided)
    parent.commits.commit()
    winner = decided["winner"]
    return winner, _structured(branches[winner], decided["result"])


def _start(parent: Parent, kind: EntryKind, check: Callable[[], None]) -> JournalEntry:
    """The journal entry of a parallel or race call: finished (replayed), pending from an
    earlier claim, or new, begun after ``check`` and the boundary checks passed."""
    call_id, recorded = parent.cursor.take(kind.value, kind)
    if recorded is not None:
        return recorded
    parent.boundary.check_continue()
    check()
    entry = JournalEntry(call_id, kind, EntryStatus.PENDING, output={})
    parent.cursor.begin(entry)
    return entry


def _raise(interrupt: Interrupt | None) -> None:
    if isinstance(interrupt, Unwind) and isinstance(interrupt.error, StoreUnavailable):
        raise interrupt.error
    if interrupt is not None:
        raise interrupt
