"""Step and effect timeouts, as a claim records and counts them.

A body cannot be interrupted from inside (``deadlines.py`` says who acts from outside),
so an attempt that overruns its timeout usually ends with its worker: killed by its
supervisor, or left behind by its lease, which the heartbeat stopped extending. The next
claim must still count that attempt, so before the body of a call with a timeout runs,
its deadline (store time) is committed in the checkpoint head
(``Checkpoint.deadlines``); it goes again in the commit that records the body's result
or failure. A claim that finds one left behind knows an earlier attempt began and never
finished: it ran past its deadline (timed out), or its worker stopped before the
deadline (interrupted). Either way:

- it counts as a failed attempt of the call's retry policy, and the task fails once the
  policy's attempts are used up, the reason naming the call and its timeout. It must be
  counted here: committing the deadline is progress to the store, so the count of claims
  without progress (``Budget.max_attempts``) would never see such a task crash-loop;
- the time it ran, up to its deadline, counts toward ``Budget.max_duration``;
- the next attempt starts in this claim, without the policy's backoff: the lease that
  had to run out first already spaced the attempts. (A body that ends past its deadline
  while its worker still holds the lease, as ``run_once`` outside a pool can see, is
  retried after the backoff like any failure; ``calls.py``.)

An effect's interrupted attempt is an interrupted effect as well: ``calls.py``
reconciles it and runs it again only when that is known to be safe.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from ..errors import StepTimedOut, gave_up_after
from ..model.checkpoint import CallDeadline
from ..workflow.specs import StepSpec
from ..workflow.step_context import StepContext
from .boundary import Boundary
from .deadlines import describe_timeout
from .interrupts import FailRequested, RetryRequested
from .logs import task_fields

log = logging.getLogger("runifold_sync.workflow.context")  # where the other attempts are logged


@attrs.frozen
class Unfinished:
    """An attempt of a call with a timeout that an earlier claim began and never ended."""

    timed_out: bool  # store time was past its deadline when this claim found it
    timeout_s: float

    def describe(self, spec: StepSpec) -> str:
        timeout = describe_timeout(self.timeout_s)
        if self.timed_out:
            return f"{spec.kind} {spec.step_id!r} timed out after {timeout}"
        name = f"{spec.kind} {spec.step_id!r}"
        return f"{name} did not finish: its worker stopped before its {timeout} timeout ran out"


class Timeouts:
    """The deadlines of one journal's calls with a timeout, in one claim."""

    def __init__(self, boundary: Boundary) -> None:
        self._commits = boundary.commits
        self._boundary = boundary
        self._claim = boundary.claim

    def mark(self, spec: StepSpec, call_id: str) -> str:
        """Record the deadline of ``call_id``'s body in the checkpoint, for the commit the
        caller makes before the body runs; returns that commit's name (crash points)."""
        assert spec.timeout is not None
        timeout_s = spec.timeout.total_seconds()
        deadline = CallDeadline(self._claim.store_now() + timeout_s, timeout_s)
        with self._commits.lock:
            self._commits.checkpoint.deadlines[call_id] = deadline
        return f"{call_id}:deadline"

    def unmark(self, call_id: str) -> None:
        """The body's attempt ended here (or never began): its deadline goes with the next
        commit."""
        with self._commits.lock:
            self._commits.checkpoint.deadlines.pop(call_id, None)

    def run(
        self, spec: StepSpec, context: StepContext, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, Exception | None, bool]:
        """Run a body with a timeout, watched by the heartbeat and the supervisor while it
        runs: its value or the exception it raised, and whether it ended past its deadline."""
        assert spec.timeout is not None
        bodies = self._claim.bodies
        bodies.begin(context.call_id, spec.timeout.total_seconds())
        try:
            value = spec.fn(context, *args, **kwargs)
        except Exception as exc:
            return None, exc, bodies.end(context.call_id)
        except BaseException:
            bodies.end(context.call_id)
            raise
        return value, None, bodies.end(context.call_id)

    def unfinished(self, call_id: str) -> Unfinished | None:
        """An attempt of ``call_id`` an earlier claim began and never ended, taken out of
        the checkpoint with its run time (up to its deadline) added to usage; None when
        there is none. Asked whatever the call's timeout is now: a deploy may have
        changed it (it is no part of the fingerprint), and the recorded deadline is what
        that attempt ran under."""
        deadlines = self._commits.checkpoint.deadlines
        if not deadlines:  # the common case, read without the lock: nothing to take
            return None
        with self._commits.lock:
            deadline = deadlines.pop(call_id, None)
        if deadline is None:
            return None
        now = self._claim.store_now()
        self._boundary.account_lost(min(now, deadline.at) - (deadline.at - deadline.timeout_s))
        return Unfinished(now >= deadline.at, deadline.timeout_s)

    def next_attempt(self, spec: StepSpec, call_id: str, prior: Unfinished, key: str | None) -> None:
        """Count ``prior`` as a failed attempt of ``call_id``: the task fails once the
        retry policy's attempts are used up (or the budget is, with the time it ran);
        otherwise the caller runs the body again."""
        with self._commits.lock:
            failures = self._commits.checkpoint.step_failures.get(call_id, 0) + 1
            self._commits.checkpoint.step_failures[call_id] = failures
        described = prior.describe(spec)
        if failures >= spec.retry.max_attempts:
            if prior.timed_out:
                raise self._gave_up(spec, key, failures, prior.timeout_s)
            raise FailRequested(
                f"{described}; {gave_up_after(failures)}",
                cause="crash_loop",
                step_id=spec.step_id,
                effect_key=key,
            )
        log.warning(
            "%s (attempt %d of %d); running it again",
            described,
            failures,
            spec.retry.max_attempts,
            extra=task_fields(self._claim.lease),
        )
        self._boundary.check_budget()

    def ended_late(self, spec: StepSpec, key: str | None, failures: int) -> RetryRequested | FailRequested:
        """What the ``failures``-th attempt of a step whose body ended past its deadline
        leads to (counted by the caller): its result, if any, is not kept, since the step
        did not finish within its timeout; retried after the policy's backoff, or the
        task fails once its attempts are used up."""
        assert spec.timeout is not None
        retry = spec.retry
        if failures < retry.max_attempts:
            described = Unfinished(True, spec.timeout.total_seconds()).describe(spec)
            return RetryRequested(
                retry.backoff_s(failures), f"{described} (attempt {failures} of {retry.max_attempts})"
            )
        return self._gave_up(spec, key, failures, spec.timeout.total_seconds())

    def _gave_up(self, spec: StepSpec, key: str | None, failures: int, timeout_s: float) -> FailRequested:
        """The task's failure after the last allowed attempt of ``spec`` timed out."""
        timeout = describe_timeout(timeout_s)
        error = StepTimedOut(self._claim.lease.task_id, str(spec.kind), spec.step_id, timeout, failures)
        return FailRequested(
            f"{spec.kind} {spec.step_id!r} timed out after {timeout}; {gave_up_after(failures)}",
            cause="step_timeout",
            error=error,
            step_id=spec.step_id,
            effect_key=key,
        )
