"""The values of the repair operations (``sql_repairs.py``): which tasks a retry or cancel
by filter acts on, and what it did."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model import validate
from ..model.values import TaskOutcome, TaskState

MAX_REDRIVE_BATCH = 1000
FIRST_IDS = 20  # how many ids a dry run (and a report) names


def _reason_text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 1000:
        validate.refuse(field, "1-1000 characters of text", value)
    return value


def _filter(check: validate.Check, name: str) -> Any:
    """A selector field: None (matches any task) or a value ``check`` accepts."""
    return validate.field(validate.optional(check), None, name=f"filter {name}")


@attrs.frozen
class TaskSelector:
    """The tasks a retry or cancel by filter acts on: those matching every field given
    (None matches any). ``reason_contains`` is text found in the task's reason (what it
    failed or was cancelled with); ``since`` and ``until`` bound the task's last change
    (for a failed task: when it failed), ``until`` excluded. At least one field must be
    given: a selector of every task is refused, not run."""

    definition: str | None = _filter(validate.name, "definition")
    version: int | None = _filter(validate.version, "version")
    state: TaskState | None = _filter(validate.is_a(TaskState), "state")
    outcome: TaskOutcome | None = _filter(validate.is_a(TaskOutcome), "outcome")
    reason_contains: str | None = _filter(_reason_text, "reason_contains")
    tenant: str | None = _filter(validate.name, "tenant")
    queue: str | None = _filter(validate.name, "queue")
    since: datetime | None = _filter(validate.moment, "since")
    until: datetime | None = _filter(validate.moment, "until")

    def __attrs_post_init__(self) -> None:
        if all(getattr(self, f.name) is None for f in attrs.fields(TaskSelector)):
            raise InvalidArgument(
                "a task filter needs at least one of definition, version, state, outcome, "
                "reason_contains, tenant, queue, since, until"
            )
        if self.version is not None and self.definition is None:
            raise InvalidArgument(f"filter version {self.version} needs a definition name")


@attrs.frozen
class Redrive:
    """What a retry or cancel by filter did (or, dry, would do): ``matched`` tasks the
    filter selected, ``changed`` of them acted on, the first ids of those (``first``),
    and the first tasks left as they were with why (``skipped``, ``skipped_count`` in all)."""

    matched: int
    changed: int
    first: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    skipped_count: int = 0
    dry_run: bool = False
