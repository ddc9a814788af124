"""The values of the repair operations (``sql_repairs.py``): which tasks a retry or cancel
by filter acts on, and what it did."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs

from ..errors import InvalidArgument
from ..model.moments import check_moment
from ..model.values import TaskOutcome, TaskState, check_int, check_name

MAX_REDRIVE_BATCH = 1000
FIRST_IDS = 20  # how many ids a dry run (and a report) names


def _name_or_none(field: str) -> Any:
    def check(_inst: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check_name(f"filter {field}", value)

    return check


def _version(_inst: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        check_int("filter version", value, minimum=1)


def _enum(kind: type) -> Any:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not isinstance(value, kind):
            raise InvalidArgument(f"filter {attribute.name} must be a {kind.__name__} or None, got {value!r}")

    return check


def _moment(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InvalidArgument(f"filter {attribute.name} must be a timezone-aware datetime, got {value!r}")
        check_moment(f"filter {attribute.name}", value)


def _reason_text(_inst: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value or len(value) > 1000):
        raise InvalidArgument(f"filter reason_contains must be 1-1000 characters of text, got {value!r}")


@attrs.frozen
class TaskSelector:
    """The tasks a retry or cancel by filter acts on: those matching every field given
    (None matches any). ``reason_contains`` is text found in the task's reason (what it
    failed or was cancelled with); ``since`` and ``until`` bound the task's last change
    (for a failed task: when it failed), ``until`` excluded. At least one field must be
    given: a selector of every task is refused, not run."""

    definition: str | None = attrs.field(default=None, validator=_name_or_none("definition"))
    version: int | None = attrs.field(default=None, validator=_version)
    state: TaskState | None = attrs.field(default=None, validator=_enum(TaskState))
    outcome: TaskOutcome | None = attrs.field(default=None, validator=_enum(TaskOutcome))
    reason_contains: str | None = attrs.field(default=None, validator=_reason_text)
    tenant: str | None = attrs.field(default=None, validator=_name_or_none("tenant"))
    queue: str | None = attrs.field(default=None, validator=_name_or_none("queue"))
    since: datetime | None = attrs.field(default=None, validator=_moment)
    until: datetime | None = attrs.field(default=None, validator=_moment)

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
