"""What is checked at a step boundary, before anything new starts, and what a body spent.

Before a body runs: the previous result is committed, the lease is still held, no cancel
is pending, the branch was not told to stop, the per-claim slice is not used up and the
budget (the task's, and a branch's share) has room for one more step. After each
commit the budget is checked again, so a body that overspends fails the task even when
it was the last one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

import attrs

from ..errors import InvalidArgument
from ..model.values import Budget, BudgetUsage
from .commits import Commits
from .interrupts import BranchStopped, CancelRequested, FailRequested, PauseRequested, YieldRequested


@attrs.frozen
class BranchScope:
    """What a parallel branch's context knows of its branch: the key that scopes its
    call ids, its budget share and the signal to stop."""

    key: str  # "parallel#1/a": scopes the branch's call ids and its journal
    reserve: Budget | None
    stop: threading.Event  # set when the branch must stop at its next step boundary
    # Shares of the parallel call's unfinished reserved branches, by key; the runner drops
    # a branch's entry when it finishes. An unreserved branch may not spend them.
    held: Mapping[str, Budget] = attrs.Factory(dict)

    def held_for_others(self, branch_usage: Mapping[str, BudgetUsage]) -> tuple[int, float]:
        """Steps and cost reserved by unfinished sibling branches and not yet spent."""
        steps, cost = 0, 0.0
        for key, share in tuple(self.held.items()):  # a snapshot: the runner removes entries
            if key == self.key:
                continue
            used = branch_usage.get(key, BudgetUsage())
            steps += max((share.max_steps or 0) - used.steps, 0)
            cost += max((share.max_cost or 0) - used.cost, 0.0)
        return steps, cost


class Boundary:
    """The checks and the usage accounting of one journal: the main function's, or one
    parallel branch's (``branch``), whose usage also counts against its share."""

    def __init__(self, commits: Commits, budget: Budget, branch: BranchScope | None = None) -> None:
        self.commits = commits
        self.claim = commits.claim  # its flags are set by the heartbeat thread
        self._progress = commits.progress
        self._budget = budget
        self.branch = branch
        self.executed = 0  # bodies this journal ran in this claim, against the slice
        # Nothing for check_budget to check (no limit on usage, no reserve): known once,
        # since the budget and the branch are fixed, rather than asked twice a step.
        self._unlimited = not budget.limits_usage() and (branch is None or branch.reserve is None)

    def check_continue(self, waiting: bool = False) -> None:
        """The lease still held, no cancel or pause requested and the branch not stopped.
        A step that already ran is recorded first, so a cancel never hides what happened.
        A pause parks the main function; a parallel branch goes on, and the main function
        parks at its first boundary after the branches."""
        claim = self.claim
        claim.check_lease()
        if waiting and claim.cancel_delivered:  # a wait in a finally: block, as a cancel unwinds
            raise CancelRequested()
        if claim.cancel and not (claim.cancel_delivered and self.branch is None):
            # Delivered once to the main function: the steps its ``finally:`` blocks call
            # while the cancel unwinds it then run, as on a failure. (A branch always stops.)
            if self.branch is None:
                claim.cancel_delivered = True
            raise CancelRequested()
        if claim.pause and self.branch is None:  # branches finish; the main function parks
            raise PauseRequested()
        if self.branch is not None and self.branch.stop.is_set():
            raise BranchStopped()

    def stop_requested(self) -> bool:
        """What ``check_continue`` would stop for, read without raising: for a running
        body's ``StepContext.cancelled`` (a cleanup step, running after the cancel was
        delivered, is not told to stop)."""
        claim = self.claim
        if claim.cancel and not (claim.cancel_delivered and self.branch is None):
            return True
        if claim.pause and self.branch is None:
            return True
        return self.branch is not None and self.branch.stop.is_set()

    def before_body(self, deadline: Callable[[], str] | None = None) -> None:
        """Checks made before a step or effect body runs, after saving the previous
        step's result: lease, cancel, slice and budget.

        ``deadline``, for a body with a timeout, records the body's deadline in the
        checkpoint and names the commit that makes it durable; that commit also saves the
        previous result, so it is made after the checks (a body refused by them leaves no
        deadline behind), and the check its answer can change (a cancel) is made again."""
        if deadline is None:
            self.commits.commit_unsaved()
        self.check_continue()
        claim = self.claim
        if claim.hand_back is not None:
            raise YieldRequested(claim.hand_back)
        if claim.max_steps_per_claim is not None and self.executed >= claim.max_steps_per_claim:
            raise YieldRequested()
        self.check_budget(next_steps=1)
        if deadline is not None:
            self.commits.commit(deadline())
            self.check_continue()

    def check_budget(self, next_steps: int = 0) -> None:
        """Fail when usage (plus the steps about to run) is over the task's budget or the
        branch's reservation."""
        if self._unlimited:
            return  # nothing to check: skip building usage objects twice a step
        branch = self.branch
        budget = self._budget
        with self._progress.lock:
            self._progress.tick()
            checkpoint = self._progress.checkpoint
            usage = checkpoint.usage.add(steps=next_steps)
            over = budget.exceeded(usage)
            if branch is not None and branch.reserve is not None and not over:
                used = checkpoint.branch_usage.get(branch.key, BudgetUsage())
                share = branch.reserve.exceeded(used.add(steps=next_steps))
                over = None if share is None else f"branch {branch.key!r} reserve: {share}"
            elif branch is not None and not over:
                steps, cost = branch.held_for_others(checkpoint.branch_usage)
                held = budget.exceeded(usage.add(steps=steps, cost=cost))
                if held is not None:
                    over = (
                        f"branch {branch.key!r} is unreserved and may not spend what its siblings "
                        f"reserved ({steps} steps, cost {cost:g} still held): {held} counting the "
                        "reservations"
                    )
        if over:
            raise FailRequested(over, cause="budget")

    def check_reservations(self, reserve: Mapping[str, Budget]) -> None:
        """Refuse parallel branches up front when the rest of the task's budget cannot
        cover their shares. Steps and cost shares add up; branches run at the same time,
        so each duration share must fit in the run time left, not their sum."""
        budget = self._budget
        with self._progress.lock:
            self._progress.tick()
            usage = self._progress.checkpoint.usage
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

    def account_lost(self, elapsed_s: float) -> None:
        """Add run time a body spent under an earlier claim that never recorded it (an
        attempt that hung past its timeout), to the task and to its branch's share."""
        with self._progress.lock:
            checkpoint = self._progress.checkpoint
            checkpoint.usage = checkpoint.usage.add(elapsed_s=elapsed_s)
            if self.branch is not None:
                used = checkpoint.branch_usage.get(self.branch.key, BudgetUsage())
                checkpoint.branch_usage[self.branch.key] = used.add(elapsed_s=elapsed_s)

    def account(self, *, steps: int, cost: float, started: float) -> None:
        """Add a body's usage to the task (its run time by a tick), and to its branch's
        share, whose time is the branch's own bodies (caller holds the lock). A body
        that completed (``steps=1``) also counts against the per-claim slice."""
        elapsed_s = time.monotonic() - started
        try:
            self._progress.tick(steps=steps, cost=cost)
            if self.branch is not None:
                usage = self._progress.checkpoint.branch_usage
                used = usage.get(self.branch.key, BudgetUsage())
                usage[self.branch.key] = used.add(steps=steps, cost=cost, elapsed_s=elapsed_s)
        except InvalidArgument as exc:  # a total past the largest float: no commit could store it
            raise FailRequested(f"budget usage cannot be counted: {exc}", cause="budget", error=exc) from exc
        self.executed += steps
