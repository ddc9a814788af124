"""Parallel branches and first-success races inside one task.

Branches run on a bounded thread pool inside the worker. Each has its own journal and
call ids scoped by branch, while every commit goes through the task's one checkpoint
revision sequence. After a crash the main function runs again: branches that finished
replay from their journals without running a step, unfinished ones continue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .codec import NotJsonable, structure, to_jsonable
from .errors import InvalidArgument, StoreUnavailable
from .interrupts import (
    BranchStopped,
    CancelRequested,
    FailRequested,
    Interrupt,
    LeaseGone,
    RetryRequested,
    YieldRequested,
)
from .models import Budget, check_name
from .workflow import return_type

if TYPE_CHECKING:
    from .context import WorkflowContext

Branch = Callable[["WorkflowContext"], Any]


class StoreAway(Interrupt):
    """A branch found the store unreachable; re-raised as StoreUnavailable after the
    siblings stopped, so the cycle ends and the task is claimed again."""

    def __init__(self, error: StoreUnavailable) -> None:
        self.error = error


# When several branches are interrupted, the most consequential interruption wins.
_SEVERITY: tuple[type[Interrupt], ...] = (
    LeaseGone,
    StoreAway,
    FailRequested,
    CancelRequested,
    RetryRequested,
    YieldRequested,
    BranchStopped,
)


def _check_branches(branches: Mapping[str, Branch], max_threads: int) -> None:
    if not branches:
        raise InvalidArgument("parallel branches must not be empty")
    for key, fn in branches.items():
        check_name("branch name", key)
        if "/" in key or "#" in key:
            raise InvalidArgument(f"branch name may not contain '/' or '#', got {key!r}")
        if not callable(fn):
            raise InvalidArgument(f"branch {key!r} must be callable with a ctx, got {fn!r}")
    if isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1:
        raise InvalidArgument(f"max_threads must be an integer >= 1, got {max_threads!r}")


def _structured(fn: Branch, raw: Any) -> Any:
    return structure(raw, return_type(fn))


def _encode(key: str, value: Any) -> Any:
    try:
        return to_jsonable(value)
    except NotJsonable as exc:
        raise FailRequested(
            f"result of branch {key!r} cannot be stored as JSON: {exc}", cause="not_serializable"
        ) from exc


def _check_reservations(ctx: WorkflowContext, reserve: Mapping[str, Budget]) -> None:
    """Refuse up front when the rest of the task's budget cannot cover the shares. Steps
    and cost shares add up; branches run at the same time, so each duration share must
    fit in the run time left, not their sum."""
    budget = ctx._definition.budget
    with ctx._progress.lock:
        ctx._progress.tick()
        usage = ctx.checkpoint.usage
    for limit, used, field in (
        (budget.max_steps, usage.steps, "max_steps"),
        (budget.max_cost, usage.cost, "max_cost"),
    ):
        wanted = sum(getattr(share, field) or 0 for share in reserve.values())
        if limit is not None and wanted > limit - used:
            raise FailRequested(
                f"parallel branches reserve {field}={wanted:g} but only {limit - used:g} of the "
                f"task's budget remains",
                cause="budget",
            )
    if budget.max_duration is None:
        return
    left = budget.max_duration - timedelta(seconds=usage.elapsed_s)
    for key, share in reserve.items():
        if share.max_duration is not None and share.max_duration > left:
            raise FailRequested(
                f"parallel branch {key!r} reserves max_duration={share.max_duration} but only "
                f"{max(left.total_seconds(), 0):.3f}s of the task's run time remains",
                cause="budget",
            )


class _Runner:
    """Runs branch functions on threads and collects each one's result or interruption."""

    def __init__(self, ctx: WorkflowContext, call_id: str, reserve: Mapping[str, Budget]) -> None:
        self.ctx = ctx
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
            branch_ctx = self.ctx.branch(full_key, self.reserve.get(key), self.stops[key], self.held)
            try:
                value = _encode(key, fn(branch_ctx))
                # Recorded, and the branch's last step committed, before its share is
                # freed: a crash while its siblings run neither runs it again nor, on the
                # resumed claim, holds its share against them.
                on_done(key, value)
                branch_ctx._commit_unsaved()
                self.held.pop(full_key, None)  # its unspent share is free for the others
            except Interrupt as interrupt:
                self._interrupted(key, interrupt)
                return
            except StoreUnavailable as exc:  # ends the cycle, as in the main function
                self._interrupted(key, StoreAway(exc))
                return
            except Exception as exc:
                failure = FailRequested(
                    f"branch {key!r} raised {type(exc).__name__}: {exc}", cause="workflow_error"
                )
                self._interrupted(key, failure)
                return
            with self.lock:
                self.results[key] = value

        with ThreadPoolExecutor(min(max_threads, len(branches))) as pool:
            for future in [pool.submit(body, key, fn) for key, fn in branches.items()]:
                future.result()

    def _interrupted(self, key: str, interrupt: Interrupt) -> None:
        with self.lock:
            self.interrupts[key] = interrupt
        if not isinstance(interrupt, BranchStopped):
            for stop in self.stops.values():  # siblings stop at their next step boundary
                stop.set()

    def worst(self, ignore: Collection[type[Interrupt]] = ()) -> Interrupt | None:
        found = [i for i in self.interrupts.values() if not isinstance(i, tuple(ignore))]
        for kind in _SEVERITY:
            for interrupt in found:
                if isinstance(interrupt, kind):
                    return interrupt
        return None


def run_parallel(
    ctx: WorkflowContext,
    branches: Mapping[str, Branch],
    reserve: Mapping[str, Budget] | None,
    max_threads: int,
) -> dict[str, Any]:
    _check_branches(branches, max_threads)
    reserve = dict(reserve or {})
    unknown = set(reserve) - set(branches)
    if unknown:
        raise InvalidArgument(f"reserve names branches that do not exist: {sorted(unknown)}")
    call_id, entry = ctx._next("parallel", "parallel")
    if entry is not None and entry.status == "done":
        ctx._cursor += 1
        return {key: _structured(fn, entry.output[key]) for key, fn in branches.items()}
    if entry is None:
        ctx._check_continue()
        _check_reservations(ctx, reserve)
        entry = ctx._begin(call_id, "parallel")
    # Branches that finished before an interruption: their results are in the pending
    # entry; only the others run again, and only theirs are reserved.
    done: dict[str, Any] = dict(entry.output or {})
    parallel_entry = entry
    runner = _Runner(ctx, call_id, {k: share for k, share in reserve.items() if k not in done})

    def on_done(key: str, value: Any) -> None:
        with ctx._progress.lock:
            done[key] = value
            parallel_entry.output = dict(done)
            ctx._progress.unsaved = f"{call_id}/{key}"  # committed by the branch right after

    runner.run({k: fn for k, fn in branches.items() if k not in done}, max_threads, on_done)
    _raise(runner.worst())
    ctx._finish(entry, done)
    return {key: _structured(fn, done[key]) for key, fn in branches.items()}


def run_race(
    ctx: WorkflowContext,
    branches: Mapping[str, Branch],
    cancel_safe: Collection[str],
    max_threads: int,
) -> tuple[str, Any]:
    """First branch to succeed wins and is recorded at once. Losers in ``cancel_safe``
    stop at their next step boundary; the others finish and are recorded as superseded."""
    _check_branches(branches, max_threads)
    safe = frozenset(cancel_safe)
    if safe - set(branches):
        raise InvalidArgument(f"cancel_safe names branches that do not exist: {sorted(safe - set(branches))}")
    call_id, entry = ctx._next("race", "race")
    if entry is not None and entry.status == "done":
        ctx._cursor += 1
        winner = entry.output["winner"]
        return winner, _structured(branches[winner], entry.output["result"])
    if entry is None:
        ctx._check_continue()
        entry = ctx._begin(call_id, "race")
    decided: dict[str, Any] = dict(entry.output or {})
    runner = _Runner(ctx, call_id, {})
    to_run = dict(branches)
    if "winner" in decided:  # decided before a crash: only unfinished unsafe losers go on
        to_run = {k: fn for k, fn in branches.items() if k != decided["winner"] and k not in safe}

    def on_done(key: str, value: Any) -> None:
        with runner.lock:
            first = "winner" not in decided
            if first:
                decided.update(winner=key, result=value)
        if first:
            ctx._record(entry, dict(decided))  # the decision is durable before losers stop
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
    ctx._finish(entry, decided)
    winner = decided["winner"]
    return winner, _structured(branches[winner], decided["result"])


def _raise(interrupt: Interrupt | None) -> None:
    if isinstance(interrupt, StoreAway):
        raise interrupt.error
    if interrupt is not None:
        raise interrupt
