"""Every store method that takes a task id checks it the same way, before the database
sees it: a number sent as one was ``TaskNotFound`` on SQLite and an outage
(``operator does not exist: text = smallint``) on PostgreSQL for ``send_signal``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

OPERATOR = {"actor": "ops", "reason": "test"}

# Each public method taking a task id, called with ``bad`` as that id.
CALLS: dict[str, Callable[[WorkflowStore, Any], object]] = {
    "send_signal": lambda s, bad: s.send_signal(bad, "go", 1, signal_id="s", sender="a"),
    "cancel": lambda s, bad: s.cancel(bad, "ops", "test"),
    "pause": lambda s, bad: s.pause(bad, **OPERATOR),
    "resume": lambda s, bad: s.resume(bad, **OPERATOR),
    "requeue": lambda s, bad: s.requeue(bad, **OPERATOR),
    "resolve_effect": lambda s, bad: s.resolve_effect(bad, "e", applied=False, result_json=None, **OPERATOR),
    "get_task": lambda s, bad: s.get_task(bad),
    "read_journal": lambda s, bad: s.read_journal(bad),
    "journal_tail": lambda s, bad: s.journal_tail(bad, 10),
    "history": lambda s, bad: s.history(bad),
    "wait_for_task": lambda s, bad: s.wait_for_task(bad, timedelta(0)),
    "get_event": lambda s, bad: s.get_event(bad, "k"),
    "published_events": lambda s, bad: s.published_events(bad),
    "pending_signals": lambda s, bad: s.pending_signals(bad),
}


@pytest.mark.parametrize("bad", [5, None, ["t1"]])
@pytest.mark.parametrize("method", sorted(CALLS))
def test_a_task_id_that_is_not_a_string_is_refused_naming_it(
    store: WorkflowStore, method: str, bad: object
) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    with pytest.raises(InvalidArgument, match="task id must be a string"):
        CALLS[method](store, bad)
