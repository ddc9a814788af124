"""The ``ctx`` a step or effect body receives."""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model import validate


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
