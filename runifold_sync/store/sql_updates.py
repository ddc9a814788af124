"""Updates (``store.update``): a caller's request that a running workflow validates
before it is recorded and answers, written once over the operations it is made of.

An update is a signal (``send_signal``, deduplicated by its id) that the workflow takes
with ``ctx.wait_for_update``: its declared validator accepts or rejects it before the
journal records anything. Either verdict is published as the task's event
``update:<id>`` (``{"reply": value}`` once the workflow calls ``ctx.reply``, or
``{"rejected": reason}``), which the caller waits for as ``get_event`` does: woken by the
event's commit, never by a timer of its own.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from ..errors import UpdateNotAnswered, UpdateRejected, WaitTimedOut
from ..model import validate
from ..model.codec import from_json
from . import checks
from .sql_operators import OperatorOperations
from .sql_results import ResultOperations

_UNANSWERED = object()  # the task finished without answering


class UpdateOperations(OperatorOperations, ResultOperations):
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    def update(
        self,
        task_id: str,
        name: str,
        payload: Any,
        *,
        timeout: timedelta,
        sender: str,
        tenant: str = "default",
        update_id: str | None = None,
    ) -> Any:
        """Send update ``name`` with ``payload`` to task ``task_id`` and return the
        workflow's reply (``ctx.reply``), waiting up to ``timeout`` for it.

        The workflow takes it with ``ctx.wait_for_update(name)``, whose declared
        validator accepts or rejects it before anything is recorded:
        :class:`UpdateRejected` (with the validator's message) when rejected,
        :class:`UpdateNotAnswered` when the task finished without answering,
        :class:`WaitTimedOut` when ``timeout`` passed first (the update stays delivered:
        the workflow may still take it; call again with the same ``update_id`` to wait
        on). ``update_id`` (default: a new one) deduplicates, as a signal id does: the
        same id and content is one update. Refused where it is sent as a signal is
        (``send_signal``: an undeclared name, a finished task...)."""
        validate.text("task id", task_id)
        timeout_s = validate.duration("update timeout", timeout).total_seconds()
        given = uuid.uuid4().hex if update_id is None else validate.text("update id", update_id)
        self.send_signal(task_id, name, payload, signal_id=given, sender=sender, tenant=tenant)
        key = checks.update_event_key(given)

        def answered() -> Any:
            text = self._event_json(task_id, key)
            if text is not None:
                return from_json(text)
            return _UNANSWERED if self._finished(task_id) is not None else None

        found = self._await(task_id, timeout_s, answered)
        if found is None:
            raise WaitTimedOut(task_id, timeout, key)
        if found is _UNANSWERED:
            raise UpdateNotAnswered(task_id, name, given)
        if "rejected" in found:
            raise UpdateRejected(task_id, name, given, found["rejected"])
        return found["reply"]
