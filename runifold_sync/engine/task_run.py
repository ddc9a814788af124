"""The replay engine of one claim: what the worker drives and ``ctx`` stands in front of.

A ``TaskRun`` puts together, for one journal (the main function's, or a parallel
branch's through ``branch``), the cursor that replays it (``replay.py``), the commits
shared by the whole claim (``commits.py``), the boundary checks (``boundary.py``), steps
and effects (``calls.py``), waits (``waits.py``), branches (``branches.py``) and the
undo (``compensation.py``). User code sees only ``context``, the authoring facade.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn, Self

from ..errors import InvalidArgument
from ..model import validate
from ..model.attributes import encode_all as encode_attributes
from ..model.checkpoint import MAIN, Checkpoint, CheckpointWrite, EntryKind, EntryStatus
from ..model.codec import from_json
from ..model.values import MAX_INPUT_BYTES, Budget
from ..store import checks
from ..store.base import WorkflowStore
from ..store.records import StreamWrite
from ..workflow.context import Branches, WorkflowContext
from ..workflow.registry import WorkflowDefinition
from ..workflow.specs import StepSpec
from ..workflow.waiting import (
    ApprovalDecision,
    ApprovalTimedOut,
    ChildHandle,
    ChildTimedOut,
    Fired,
    SignalTimedOut,
    Update,
    WaitItem,
)
from .boundary import Boundary, BranchScope
from .branches import Parent, run_parallel, run_race
from .calls import Calls
from .children import Children
from .claim import Claim
from .commits import Commits
from .compensation import Compensation
from .interrupts import ContinueRequested
from .replay import Cursor
from .waits import Waits


class TaskRun:
    """One claim's run of a task's main function (or of one of its parallel branches)."""

    # How its journals are walked: a dry replay (``dry_replay.py``) swaps in a cursor that
    # stops where a call would run for real.
    cursor_type: type[Cursor] = Cursor

    def __init__(
        self, commits: Commits, definition: WorkflowDefinition, branch: BranchScope | None = None
    ) -> None:
        """The run of one journal of a claim whose commits are ``commits``: the main
        function's, or with ``branch`` a parallel branch's (see :meth:`open` and
        :meth:`branch`)."""
        self.commits = commits
        self._definition = definition
        key = None if branch is None else branch.key
        self.cursor = cursor = self.cursor_type(
            commits.checkpoint, commits.lock, commits.claim.lease.task_id, key
        )
        self.boundary = boundary = Boundary(commits, definition.budget, branch)
        self.calls = Calls(cursor, boundary, definition.workflow)
        self.waits = Waits(cursor, boundary, definition)
        self.children = Children(cursor, boundary)
        # ctx.write_stream calls of this claim's run of the main function, per key: each
        # call's seq, the same on every claim since the function runs from the top.
        self._stream_writes: dict[str, int] = {}

    @classmethod
    def open(
        cls, claim: Claim, definition: WorkflowDefinition, checkpoint: Checkpoint, store: WorkflowStore
    ) -> Self:
        """The run of ``claim``'s main function, from ``checkpoint`` as the claim read it."""
        return cls(Commits(claim, store, checkpoint), definition)

    def branch(
        self, key: str, reserve: Budget | None, stop: threading.Event, held: Mapping[str, Budget]
    ) -> Self:
        """A run of one parallel branch: same claim, checkpoint and commits, its own
        journal and call ids scoped by ``key``; ``held`` are the reservations of all
        branches."""
        return type(self)(self.commits, self._definition, BranchScope(key, reserve, stop, held))

    # --- what the worker reads and drives -----------------------------------------

    @property
    def context(self) -> WorkflowContext:
        """A ``ctx`` for this run's main function (or branch). Made on each use rather
        than kept: a run holding its context, which holds the run, made every claim a
        reference cycle that only the garbage collector could free (a tenth of a
        one-step task's CPU went to collections, measured)."""
        return WorkflowContext(self)

    @property
    def claim(self) -> Claim:
        return self.commits.claim

    @property
    def task_id(self) -> str:
        return self.commits.claim.lease.task_id

    @property
    def tenant(self) -> str:
        return self.commits.claim.lease.tenant

    @property
    def fence(self) -> int:
        return self.commits.claim.lease.fencing_token

    @property
    def checkpoint(self) -> Checkpoint:
        return self.commits.checkpoint

    @property
    def revision(self) -> int:
        return self.commits.revision

    def forget_failure(self, call_id: str) -> None:
        """Take the recorded final failure ``call_id`` back out of the main journal when
        nothing was recorded after it, as the task fails of it uncaught: the journal then
        ends where it did before there was a failure to catch, so an operator's ``retry``
        runs the step again (an effect's entry goes back to its intent, which a retry
        reconciles as it always did). With calls recorded after it (a ``finally:`` block's),
        it stays: a replay must meet it where it was."""
        journal = self.checkpoint.journal
        if not journal or journal[-1].call_id != call_id or journal[-1].status != EntryStatus.FAILED:
            return
        entry = journal[-1]
        with self.commits.lock:
            if entry.kind == EntryKind.EFFECT:
                entry.status, entry.output = EntryStatus.INTENT, None
            else:
                self.checkpoint.remove(MAIN, entry)

    @property
    def cancel_delivered(self) -> bool:
        """A cancel reached the main function in this claim: however it then ends (a
        ``finally:`` block that raised, or waited), the task ends cancelled."""
        return self.commits.claim.cancel_delivered

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
        return Compensation(self.boundary, self._definition.workflow)

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
        self,
        name: str,
        version: int,
        input: Any,
        checkpoint_id: str | None,
        tenant: str | None,
        queue: str,
        detached: bool = False,
    ) -> ChildHandle:
        return self.children.start(name, version, input, checkpoint_id, tenant, queue, detached)

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

    def patched(self, change_id: str) -> bool:
        """The marker is committed with the next commit: a crash before it loses the
        marker and the path taken after it together, so the replay decides again."""
        return self.cursor.patch(change_id)

    def deprecate_patch(self, change_id: str) -> None:
        self.cursor.patch(change_id, record=False)

    def now(self) -> datetime:
        return self.waits.now()

    def wait_any(self, items: tuple[WaitItem, ...], result_type: Any, payload_type: Any) -> Fired:
        return self.waits.wait_any(items, result_type, payload_type)

    def wait_for_signals(
        self, names: tuple[str, ...], timeout: timedelta | None, until: datetime | None, payload_type: Any
    ) -> Any:
        return self.waits.wait_for_signals(names, timeout, until, payload_type)

    def set_attributes(self, values: Mapping[str, Any]) -> None:
        """Set search attributes now, in a commit of the checkpoint as it stands, unless
        this call is being replayed: the rule of :meth:`set_event`, for the same reasons
        (a stored attribute never reports progress the journal lacks, and a replay never
        puts back an older value over a newer one)."""
        attributes = encode_attributes("set_attributes", values)
        if not attributes or self.cursor.replaying:
            return
        self.commits.commit_attributes(attributes)

    def wait_for_update(
        self, name: str, timeout: timedelta | None, payload_type: Any
    ) -> Update | SignalTimedOut:
        validator = self._definition.workflow.validators.get(name)
        return self.waits.wait_for_update(name, timeout, payload_type, validator)

    def reply(self, update: Update, value: Any) -> None:
        """Answer ``update`` (event ``update:<id>``, ``{"reply": value}``), by the rule of
        :meth:`set_event`: committed now unless replayed."""
        key = checks.update_event_key(update.update_id)
        value_json = checks.event(key, {"reply": value})
        if self.cursor.replaying:
            return
        self.commits.commit_event(key, value_json)

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` to stream ``key`` now, in a commit of the checkpoint as it
        stands, unless this call is being replayed: the rule of :meth:`set_event`. The
        call's seq (its place among this run's writes to ``key``) makes a write made
        again at the journal's end (the crash came after its commit) a no-op in the
        store, so a value is appended once. The main function only: branches run in no
        fixed order, so their writes would have no stable place."""
        value_json = checks.stream_value(key, value)
        if self.cursor.scope is not None:
            raise InvalidArgument(
                f"write_stream is for the main function, not parallel branch {self.cursor.scope!r}"
            )
        seq = self._stream_writes.get(key, 0) + 1
        self._stream_writes[key] = seq
        if self.cursor.replaying:
            return
        self.commits.commit_stream(StreamWrite(key, value_json, self.checkpoint.run, "", seq))

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

        return Parent(self.cursor, self.boundary, fork)
