"""``Schedule``: run a workflow version on a cron expression or at a fixed interval.

A schedule is declared in code, added to the registry (``registry.add_schedule``), and
ticks wherever a worker of that registry runs (``schedule_ticker``). Each tick is one
task with id ``schedule:<name>:<tick in UTC ISO 8601>``, so however many pools run, a
tick's task is created once: the store's schedule row and the task id both say so.

The task's input is ``{"schedule": name, "tick": "2026-12-02T03:00:00Z", "input":
<the schedule's input>}``, always those three keys, which :class:`ScheduleTick` (or a
class of your own with the same fields) structures.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from ..errors import InvalidArgument
from . import validate
from .codec import MAX_NESTING_DEPTH, NestedTooDeep, from_json, to_json
from .schedule_times import ScheduleTimes, cron_times, interval_times, tick_text
from .values import MAX_INPUT_BYTES

TASK_PREFIX = "schedule:"
# A name goes into task ids, log lines and file names (fence files are named by task id):
# no ':' (it separates the id's parts), '/', '#' or spaces.
# Every tick's text has the same length (``tick_text``), so the task input of this tick
# measures the task input of every tick.
_SAMPLE_TICK = datetime(2000, 1, 1, tzinfo=UTC)


_schedule_name = validate.matching(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", "1-100 letters, digits and ._- starting with a letter or digit"
)


def _canonical_input(name: str, value: Any) -> Any:
    """Schedule ``name``'s input as it will be stored: JSON, checked where it is given."""
    try:
        return from_json(to_json(value))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"schedule {name!r} input {value!r} is not JSON-serializable: {exc}") from None


@attrs.frozen
class ScheduleTick:
    """The input of a tick's task, for a main function to annotate:
    ``def main(ctx, run: ScheduleTick)``. ``tick`` is the tick's time (UTC), not when the
    task started; ``input`` is the schedule's own input."""

    schedule: str
    tick: datetime
    input: Any = None


@attrs.frozen
class Schedule:
    """Run ``workflow`` at ``version`` on each tick of ``cron`` (a 5-field expression,
    read in ``timezone``) or ``every`` (a whole number of seconds, counted from the Unix
    epoch): exactly one of the two. ``input`` is passed to every run (see
    :class:`ScheduleTick`); its ticks' tasks go on ``queue``. Construction checks every
    field with :class:`InvalidArgument` naming it, ``input`` included (JSON, within the
    nesting and size limits of a task's input once its ticks wrap it);
    ``registry.add_schedule`` checks that the workflow version is registered and that
    the ticks' input fits its main function."""

    name: str = validate.field(_schedule_name, name="schedule name")
    workflow: str = validate.field(validate.name, name="schedule workflow")
    version: int = validate.field(validate.version)
    cron: str | None = attrs.field(default=None, kw_only=True)
    every: timedelta | None = attrs.field(default=None, kw_only=True)
    timezone: str = attrs.field(default="UTC", kw_only=True)
    input: Any = attrs.field(default=None, kw_only=True)  # made canonical in __attrs_post_init__
    # The named queue its ticks' tasks go on (only workers claiming from it run them).
    queue: str = attrs.field(
        default="default", kw_only=True, validator=lambda _i, _a, v: validate.name("schedule queue", v)
    )
    times: ScheduleTimes = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # Here rather than a converter, which cannot name the schedule its error is about.
        object.__setattr__(self, "input", _canonical_input(self.name, self.input))
        if (self.cron is None) == (self.every is None):
            raise InvalidArgument(
                f"schedule {self.name!r} needs exactly one of cron= and every=, got "
                f"cron={self.cron!r} every={self.every!r}"
            )
        if self.cron is not None:
            times: ScheduleTimes = cron_times(self.cron, self.timezone, self.name)
        else:
            times = interval_times(self.every, self.timezone, self.name)
        object.__setattr__(self, "times", times)
        self._check_tick_input()

    def _check_tick_input(self) -> None:
        """Refuse, naming the schedule, an input its ticks' tasks could not carry: the
        task input wraps it (:meth:`tick_input`) and is held to what enqueue allows
        (``WorkflowTask.new``: nesting, :data:`~runifold_sync.model.values.MAX_INPUT_BYTES`),
        which would otherwise be found only by ``registry.add_schedule``, in a message
        about a workflow input that names no schedule."""
        try:
            text = to_json(self.tick_input(_SAMPLE_TICK), max_depth=MAX_NESTING_DEPTH)
        except NestedTooDeep:
            raise InvalidArgument(
                f"schedule {self.name!r} input nests deeper than {MAX_NESTING_DEPTH - 1} levels, "
                f"so its ticks' task input (which holds it) would nest deeper than {MAX_NESTING_DEPTH}"
            ) from None
        size = len(text.encode())
        if size > MAX_INPUT_BYTES:
            raise InvalidArgument(
                f"schedule {self.name!r} input makes its ticks' task input {size} bytes encoded, over "
                f"the limit of {MAX_INPUT_BYTES}; store large data outside and pass its id"
            )

    @property
    def every_s(self) -> int | None:
        return None if self.every is None else int(self.every.total_seconds())

    def task_id(self, tick: datetime) -> str:
        """``schedule:<name>:<tick in UTC>``: one task per tick, whoever creates it."""
        return f"{TASK_PREFIX}{self.name}:{tick_text(tick)}"

    def tick_input(self, tick: datetime) -> dict[str, Any]:
        return {"schedule": self.name, "tick": tick_text(tick), "input": self.input}
