"""The replay engine of one claim: what the worker drives and ``ctx`` stands in front of.

A ``TaskRun`` puts together, for one journal (the main function's, or a parallel
branch's through ``branch``), the cursor that replays it (``replay.py``), the commits
shared by the whole claim (``commits.py``), the boundary checks (``boundary.py``), steps
and effects (``calls.py``), waits (``waits.py``), branches (``branches.py``) and the
undo (``compensation.py``). User code sees only ``context``, the authoring facade.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn

from ..errors import InvalidArgument
from ..model import validate
from ..model.checkpoint import Checkpoint, CheckpointWrite
from ..model.codec import from_json
from ..model.values import MAX_INPUT_BYTES, Budget
from ..store import checks
from ..store.base import WorkflowStore
from ..store.records import ClaimedTask, Lease
from ..workflow.context import Branches, WorkflowContext
from ..workflow.registry import WorkflowDefinition
from ..workflow.specs import StepSpec
from ..workflow.waiting import ApprovalDecision, ApprovalTimedOut, ChildHandle, ChildTimedOut
from .boundary import Boundary, BranchScope
from .branches import Parent, run_parallel, run_race
from .calls import Calls
from .children import Children
from .claim import LeaseFlags
from .commits import Commits, Progress
from .compensation import Compensation
from .interrupts import ContinueRequested
from .replay import Cursor
from .spans import NO_SPANS, ClaimSpans
from .timeouts import Timeouts
from .waits import Waits


class TaskRun:
    """One claim's run of a task's main function (or of one of its parallel branches)."""

    def __init__(
        self,
        *,
        claimed: ClaimedTask,
        definition: WorkflowDefinition,
        checkpoint: Checkpoint,
        store: WorkflowStore,
        flags: LeaseFlags,
        max_steps_per_claim: int | None,
        max_entry_bytes: int,
        spans: ClaimSpans = NO_SPANS,
    ) -> None:
        self._claimed = claimed
        self._spans = spans  # the claim's bodies and waits report to its cycle span
        self._definition = definition
        self._store = store
        self._flags = flags  # set by the heartbeat thread
        self._max_steps_per_claim = max_steps_per_claim
        self.commits = Commits(
            progress=Progress(checkpoint, claimed.revision),
            store=store,
            lease=claimed.lease,
            flags=flags,
            max_entry_bytes=max_entry_bytes,
        )
        self._open(Cursor(checkpoint, self.commits.lock, self.task_id), None)

    def _open(self, cursor: Cursor, branch: BranchScope | None) -> None:
        """Set up the parts of this run that belong to one journal."""
        definition, lease = self._definition, self.lease
        self.cursor = cursor
        self.boundary = Boundary(
            commits=self.commits,
            flags=self._flags,
            budget=definition.budget,
            task_id=lease.task_id,
            fence=lease.fencing_token,
            max_steps_per_claim=self._max_steps_per_claim,
            branch=branch,
        )
        self.calls = Calls(
            cursor=cursor,
            commits=self.commits,
            boundary=self.boundary,
            lease=lease,
            undoable=definition.workflow.compensations,
            resolutions=self._claimed.resolutions,
            timeouts=Timeouts(commits=self.commits, boundary=self.boundary, flags=self._flags, lease=lease),
            spans=self._spans,
        )
        self.waits = Waits(
            cursor=cursor,
            commits=self.commits,
            boundary=self.boundary,
            store=self._store,
            workflow=repr(definition.workflow),
            signals=definition.workflow.signals,
            sender_policy=definition.sender_policy,
            branch=None if branch is None else branch.key,
            spans=self._spans,
        )
        self.children = Children(
            cursor=cursor,
            boundary=self.boundary,
            store=self._store,
            tenant=lease.tenant,
            branch=None if branch is None else branch.key,
            spans=self._spans,
        )

    def branch(
        self, key: str, reserve: Budget | None, stop: threading.Event, held: Mapping[str, Budget]
    ) -> TaskRun:
        """A run of one parallel branch: same lease, checkpoint and commits, its own
        journal and call ids scoped by ``key``; ``held`` are the reservations of all
        branches."""
        child = copy.copy(self)  # shares the claim's parts; _open replaces the journal's
        cursor = Cursor(self.checkpoint, self.commits.lock, self.task_id, key)
        child._open(cursor, BranchScope(key, reserve, stop, held))
        return child

    # --- what the worker reads and drives -----------------------------------------

    @property
    def context(self) -> WorkflowContext:
        """A ``ctx`` for this run's main function (or branch). Made on each use rather
        than kept: a run holding its context, which holds the run, made every claim a
        reference cycle that only the garbage collector could free (a tenth of a
        one-step task's CPU went to collections, measured)."""
        return WorkflowContext(self)

    @property
    def task_id(self) -> str:
        return self._claimed.lease.task_id

    @property
    def tenant(self) -> str:
        return self._claimed.lease.tenant

    @property
    def lease(self) -> Lease:
        return self._claimed.lease

    @property
    def fence(self) -> int:
        return self._claimed.lease.fencing_token

    @property
    def checkpoint(self) -> Checkpoint:
        return self.commits.checkpoint

    @property
    def revision(self) -> int:
        return self.commits.revision

    def encode(self) -> CheckpointWrite:
        """What changed in the checkpoint since the last commit, its run time brought up
        to now."""
        return self.commits.encode()

    def encode_next_run(self) -> tuple[int, CheckpointWrite]:
        """The number and head of the run a ``continue_as_new`` starts."""
        return self.commits.encode_next_run()

    def commit(self, subject: str = "") -> None:
        """Commit the checkpoint (``subject`` names the commit for crash points)."""
        self.commits.commit(subject)

    def needs_compensation(self) -> bool:
        """True when a completed step has a declared compensation not yet run."""
        return self._compensation().needed()

    def compensate(self, cause: str, reason: str) -> None:
        """Undo completed steps newest first, committing after each, after the task
        failed or was cancelled. A compensation that raises fails the task as it is."""
        self._compensation().run(cause, reason)

    def _compensation(self) -> Compensation:
        return Compensation(
            commits=self.commits, boundary=self.boundary, workflow=self._definition.workflow, lease=self.lease
        )

    # --- the Runtime port ctx calls through -----------------------------------------

    def call(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.calls.call(spec, args, kwargs)

    def timer(self, deadline: Callable[[datetime], datetime]) -> None:
        self.waits.timer(deadline)

    def wait_for_signal(self, name: str, timeout: timedelta | None, payload_type: Any) -> Any:
        return self.waits.wait_for_signal(name, timeout, payload_type)

    def request_approval(
        self,
        name: str,
        approvers: Iterable[str],
        timeout: timedelta | None,
        escalate_to: Iterable[str],
        escalation_timeout: timedelta | None,
    ) -> ApprovalDecision | ApprovalTimedOut:
        return self.waits.request_approval(name, approvers, timeout, escalate_to, escalation_timeout)

    def start_child(
        self, name: str, version: int, input: Any, checkpoint_id: str | None, tenant: str | None, queue: str
    ) -> ChildHandle:
        return self.children.start(name, version, input, checkpoint_id, tenant, queue)

    def wait_children(
        self, handles: Sequence[ChildHandle], timeout: timedelta | None, result_type: Any
    ) -> list[Any] | ChildTimedOut:
        return self.children.wait(handles, timeout, result_type)

    def parallel(
        self, branches: Branches, reserve: Mapping[str, Budget] | None, max_threads: int
    ) -> dict[str, Any]:
        return run_parallel(self._parent(), branches, reserve, max_threads)

    def race(self, branches: Branches, cancel_safe: Iterable[str], max_threads: int) -> tuple[str, Any]:
        return run_race(self._parent(), branches, cancel_safe, max_threads)

    def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` as event ``key`` now, in a commit of the checkpoint as it
        stands, unless this call is being replayed.

        The commit carries every result held back before it (``Commits.commit_event``),
        so a stored event never reports progress the journal lacks, and it is made before
        the call returns, so anything the journal records after it was recorded later.
        Replay therefore skips a call with recorded calls after it (its value was stored
        then, and writing it again could put back an older value over a newer one) and
        makes one at the journal's end again (the crash came before its commit, or after
        it with nothing recorded since: the same value is written again)."""
        value_json = checks.event(key, value)
        if self.cursor.replaying:
            return
        self.commits.commit_event(key, value_json)

    def continue_as_new(self, input: Any) -> NoReturn:
        """Check ``input`` against the workflow's input type here, at the call, then end
        the run (the worker makes the transition)."""
        if self.cursor.scope is not None:
            raise InvalidArgument(
                f"continue_as_new is for the main function, not parallel branch {self.cursor.scope!r}"
            )
        input_json = validate.json_text("continue_as_new input", input, limit=MAX_INPUT_BYTES)
        self._definition.structure_input(from_json(input_json), "continue_as_new input")
        raise ContinueRequested(input_json)

    def _parent(self) -> Parent:
        def fork(
            key: str, reserve: Budget | None, stop: threading.Event, held: Mapping[str, Budget]
        ) -> WorkflowContext:
            return self.branch(key, reserve, stop, held).context

        return Parent(self.cursor, self.boundary, self.commits, fork)
