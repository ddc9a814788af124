"""The ``ctx`` a step or effect body receives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model.values import check_cost


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
    # Appends to the task's stream: (key, value, seq); set by the engine for a step body
    # run under a lease (write_stream), None where there is no run (reconcile).
    streams: Callable[[str, Any, int], None] | None = attrs.field(default=None, repr=False, eq=False)
    _stream_writes: dict[str, int] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` to the task's stream ``key`` from inside the body (progress of
        a long step), fenced by the lease; readers see it at once, before the step's
        result is recorded. A re-run of this step (after a crash or a retry) appends only
        the values past the ones its earlier attempts wrote: the n-th write of the call
        to ``key`` is written once."""
        if self.streams is None:
            raise InvalidArgument(f"write_stream is not available here ({self.call_id}): no run to write to")
        seq = self._stream_writes.get(key, 0) + 1
        self._stream_writes[key] = seq
        self.streams(key, value, seq)

    def charge(self, cost: float) -> None:
        """Add ``cost`` units (tokens, cents...) to the task's budget usage: a finite
        number >= 0, keeping the body's total finite (usage is stored as JSON, which
        has no infinity). A refused cost fails the attempt, never retried, since every
        attempt would charge it again."""
        try:
            self.cost = check_cost("charge cost", cost, self.cost)
        except InvalidArgument as exc:
            self.refused = exc
            raise
