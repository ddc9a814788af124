"""The ``ctx`` a step or effect body receives."""

from __future__ import annotations

from typing import Any

import attrs

from .errors import InvalidArgument


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

    def charge(self, cost: float) -> None:
        """Add ``cost`` units (tokens, cents...) to the task's budget usage."""
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost >= 0:
            raise InvalidArgument(f"charge must be a non-negative number, got {cost!r}")
        self.cost += cost
