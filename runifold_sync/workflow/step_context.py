"""The ``ctx`` a step or effect body receives."""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from ..errors import InvalidArgument
from ..model import validate


class StepRuntime(Protocol):
    """The port a step body's ``ctx`` calls through for what touches its run: the engine
    (``engine/calls.py``) implements it, so authoring code never imports the engine."""

    def heartbeat(self, call_id: str, details: Any) -> None: ...

    def cancelled(self) -> bool: ...

    def set_event(self, call_id: str, key: str, value: Any) -> None: ...

    def write_stream(self, call_id: str, key: str, value: Any, seq: int) -> None: ...


@attrs.define
class StepContext:
    """What a step or effect body receives: identity for logs and idempotency, the
    fencing token for conditional writes of its own, and cost accounting."""

    task_id: str
    call_id: str
    attempt: int
    fence: int
    idempotency_key: str | None
    cost: float = 0.0
    # A ``@workflow.transaction()`` body's database connection, inside the transaction
    # that records the step's completion (psycopg 3 with rows as dicts, or sqlite3); None
    # for any other step or effect.
    connection: Any = None
    # The error of a refused ``charge``, kept so that the attempt fails whether or not
    # the body caught it: a cost that cannot be counted must not go uncounted.
    refused: InvalidArgument | None = None
    # The details of the last heartbeat an earlier attempt of this call committed (after a
    # retry, a pause or a crash), for a long body to resume where it got to; None at first.
    last_heartbeat: Any = None
    # The run this body belongs to; None for a context with no run behind it (reconcile).
    runtime: StepRuntime | None = attrs.field(default=None, repr=False)

    def heartbeat(self, details: Any = None) -> None:
        """Tell the run this body is alive and, with ``details`` (JSON), how far it got:
        the details are committed for this call (one fenced write), and the next attempt
        after a retry, a pause or a crash reads them as ``last_heartbeat``. Without
        details nothing is written (the worker's heartbeat thread keeps the lease). A lost
        lease ends the body here. Details are refused in a transaction step, whose body
        runs inside the store's transaction."""
        if self.runtime is not None:
            self.runtime.heartbeat(self.call_id, details)

    @property
    def cancelled(self) -> bool:
        """True once the worker's heartbeat thread heard of a cancel or pause request for
        this task: a long body should stop early (return, or raise; an attempt that raises
        after this is not counted as a failure). The task then stops at this step: a
        cancelled one runs its compensations, a paused one runs this step again once
        resumed."""
        return self.runtime is not None and self.runtime.cancelled()

    def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` as the task's event ``key`` now, from inside the body (as
        ``WorkflowContext.set_event``; last write wins). A body that runs again after a
        crash publishes again; a recorded step never does."""
        if self.runtime is None:
            raise InvalidArgument(f"set_event needs a running step; {self.call_id!r} has no run behind it")
        self.runtime.set_event(self.call_id, key, value)

    # Each stream key's writes so far in this attempt: the seq of the next one.
    _stream_writes: dict[str, int] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` to the task's stream ``key`` from inside the body (progress of
        a long step), fenced by the lease; readers see it at once, before the step's
        result is recorded. A re-run of this step (after a crash or a retry) appends only
        the values past the ones its earlier attempts wrote: the n-th write of the call
        to ``key`` is written once."""
        if self.runtime is None:
            raise InvalidArgument(f"write_stream is not available here ({self.call_id}): no run to write to")
        seq = self._stream_writes.get(key, 0) + 1
        self._stream_writes[key] = seq
        self.runtime.write_stream(self.call_id, key, value, seq)

    def charge(self, cost: float) -> None:
        """Add ``cost`` units (tokens, cents...) to the task's budget usage: a finite
        number >= 0, keeping the body's total finite (usage is stored as JSON, which
        has no infinity). A refused cost fails the attempt, never retried, since every
        attempt would charge it again."""
        try:
            self.cost = validate.cost("charge cost", cost, self.cost)
        except InvalidArgument as exc:
            self.refused = exc
            raise
