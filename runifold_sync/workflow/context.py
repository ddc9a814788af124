"""``ctx`` in a workflow's main function: the authoring API, and nothing of the engine.

Only the calls made through ``ctx`` are durable (steps and effects, called with it as
their first argument; timers, signal waits, approvals, parallel branches and races, and
the events it publishes);
everything else in the main function must be deterministic, since the function runs
from the top on every claim and replays what its journal recorded (``replay.py``).

The object is a facade over the replay engine of one claim, which the worker drives. It
reaches the engine through the ``Runtime`` port declared here, a protocol of methods the
engine implements, so that authoring code never imports the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, Unpack

from ..model import validate
from ..model.values import Budget
from .waiting import (
    ApprovalDecision,
    ApprovalTimedOut,
    ChildHandle,
    ChildStart,
    ChildTimedOut,
)

if TYPE_CHECKING:
    from .specs import StepSpec

Branches = Mapping[str, Callable[["WorkflowContext"], Any]]


# A wait's timeout: None (wait for ever) or a positive duration a store can add to its clock.
_wait_timeout = validate.optional(validate.positive_duration)


class Runtime(Protocol):
    """The port ``ctx`` calls through: everything durable a workflow can ask of the
    engine that runs it. The engine (``engine/task_run.py``) implements it; authoring code
    names only this, so it never imports the engine."""

    @property
    def task_id(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def fence(self) -> int: ...

    def call(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    def timer(self, deadline: Callable[[datetime], datetime]) -> None: ...

    def wait_for_signal(self, name: str, timeout: timedelta | None, payload_type: Any) -> Any: ...

    def request_approval(
        self,
        name: str,
        approvers: Iterable[str],
        timeout: timedelta | None,
        escalate_to: Iterable[str],
        escalation_timeout: timedelta | None,
    ) -> ApprovalDecision | ApprovalTimedOut: ...

    def start_child(
        self, name: str, version: int, input: Any, checkpoint_id: str | None, tenant: str | None, queue: str
    ) -> ChildHandle: ...

    def wait_children(
        self, handles: Sequence[ChildHandle], timeout: timedelta | None, result_type: Any
    ) -> list[Any] | ChildTimedOut: ...

    def parallel(
        self, branches: Branches, reserve: Mapping[str, Budget] | None, max_threads: int
    ) -> dict[str, Any]: ...

    def race(self, branches: Branches, cancel_safe: Iterable[str], max_threads: int) -> tuple[str, Any]: ...

    def continue_as_new(self, input: Any) -> NoReturn: ...

    def set_event(self, key: str, value: Any) -> None: ...


class WorkflowContext:
    """``ctx`` in a workflow's main function (and in each of its parallel branches)."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Runtime) -> None:
        self._engine = engine

    def __repr__(self) -> str:
        return f"WorkflowContext(task_id={self.task_id!r})"

    @property
    def task_id(self) -> str:
        return self._engine.task_id

    @property
    def tenant(self) -> str:
        return self._engine.tenant

    @property
    def fence(self) -> int:
        """The lease's fencing token: make the application's own writes conditional on it."""
        return self._engine.fence

    # --- timers ------------------------------------------------------------------

    def sleep(self, duration: timedelta) -> None:
        """Wait durably for ``duration`` of store time; the worker is freed meanwhile."""
        validate.duration("sleep duration", duration)
        self._engine.timer(lambda now: now + duration)

    def sleep_until(self, deadline: datetime) -> None:
        """Wait durably until ``deadline`` in store time."""
        validate.moment("sleep_until deadline", deadline)
        self._engine.timer(lambda _now: deadline)

    # --- signals and approvals -------------------------------------------------------

    def wait_for_signal(self, name: str, *, timeout: timedelta | None = None, payload_type: Any = Any) -> Any:
        """Wait durably for a signal named ``name`` (declared on the workflow). Returns its
        payload, structured as ``payload_type``, or :class:`SignalTimedOut`. A signal sent
        before the wait is kept for it; the definition's sender policy may refuse one."""
        return self._engine.wait_for_signal(name, _wait_timeout("signal timeout", timeout), payload_type)

    def request_approval(
        self,
        name: str,
        *,
        approvers: Iterable[str],
        timeout: timedelta | None = None,
        escalate_to: Iterable[str] = (),
        escalation_timeout: timedelta | None = None,
    ) -> ApprovalDecision | ApprovalTimedOut:
        """Wait for a person in ``approvers`` to send signal ``name`` with payload
        ``{"approved": bool, "reason": ...}``. Decisions from anyone else are refused and
        kept in the history. On timeout, ``escalate_to`` (if any) is asked next."""
        first, later = _wait_timeout("approval timeout", timeout), escalation_timeout
        later = _wait_timeout("approval escalation timeout", later)
        return self._engine.request_approval(name, approvers, first, escalate_to, later)

    # --- child workflows ------------------------------------------------------------

    def start_child(
        self,
        name: str,
        version: int,
        input: Any,
        *,
        checkpoint_id: str | None = None,
        tenant: str | None = None,
        queue: str = "default",
    ) -> ChildHandle:
        """Enqueue a task of ``name`` at ``version`` as this task's child, once: a replay
        returns the same handle. Its id is ``checkpoint_id``, else derived from this
        task's id and the call's. It runs on its own (its own budget and retries; this
        task's tenant unless ``tenant``; on the named ``queue``, ``default`` unless given,
        whatever this task's queue) until waited for with :meth:`wait_child`."""
        return self._engine.start_child(name, version, input, checkpoint_id, tenant, queue)

    def wait_child(
        self, handle: ChildHandle, *, timeout: timedelta | None = None, result_type: Any = Any
    ) -> Any:
        """Wait durably (the worker is freed) until the child ends, and return its
        result structured as ``result_type``; :class:`ChildFailed` when it failed or
        was cancelled; :class:`ChildTimedOut` when ``timeout`` passed first."""
        waited = self._engine.wait_children(
            [handle], _wait_timeout("child wait timeout", timeout), result_type
        )
        return waited if isinstance(waited, ChildTimedOut) else waited[0]

    def wait_children(
        self, handles: Sequence[ChildHandle], *, timeout: timedelta | None = None, result_type: Any = Any
    ) -> list[Any] | ChildTimedOut:
        """Wait for all of ``handles``; their results in the same order, or
        :class:`ChildFailed` for the first (in that order) that did not complete."""
        return self._engine.wait_children(
            list(handles), _wait_timeout("child wait timeout", timeout), result_type
        )

    def run_child(
        self,
        name: str,
        version: int,
        input: Any,
        *,
        timeout: timedelta | None = None,
        result_type: Any = Any,
        **start: Unpack[ChildStart],
    ) -> Any:
        """:meth:`start_child` (``checkpoint_id``, ``tenant``, ``queue`` are its) then
        :meth:`wait_child`."""
        _wait_timeout("child wait timeout", timeout)  # before the child is started, not after
        handle = self.start_child(name, version, input, **start)
        return self.wait_child(handle, timeout=timeout, result_type=result_type)

    # --- parallel branches and races ------------------------------------------------

    def parallel(
        self,
        branches: Branches,
        *,
        reserve: Mapping[str, Budget] | None = None,
        max_threads: int = 4,
    ) -> dict[str, Any]:
        """Run ``branches`` (name -> function of a branch ctx) on up to ``max_threads``
        threads and return each one's result. ``reserve`` gives branches a share of the
        task's budget (steps, cost, duration), refused up front if the remaining budget
        cannot cover all shares. A reserved branch may spend its share; an unreserved one
        only what no unfinished sibling holds. Waits (timers, signals) belong in the main
        function."""
        return self._engine.parallel(branches, reserve, max_threads)

    def race(
        self,
        branches: Branches,
        *,
        cancel_safe: Iterable[str] = (),
        max_threads: int = 4,
    ) -> tuple[str, Any]:
        """First success wins: returns (branch name, result), recorded for replay. Losers
        named in ``cancel_safe`` stop at their next step boundary; the others are left
        to finish (an effect in flight is never abandoned) and recorded as superseded."""
        return self._engine.race(branches, cancel_safe, max_threads)

    # --- events ----------------------------------------------------------------------

    def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` (JSON, at most 64 KiB encoded) as this task's event ``key``
        (a name: printable, trimmed, at most 200 characters), for callers of
        ``store.get_event`` and ``show``: "what stage is my order in" without reading
        the journal. Last write wins. It is committed before the call returns, together
        with the progress made so far, so a caller never sees an event ahead of the
        steps it reports; a replayed call writes nothing. A crash before that commit
        publishes nothing, and the next claim's replay reaches the call and publishes it.
        Costs one fenced write (none when replayed)."""
        self._engine.set_event(key, value)

    # --- runs ------------------------------------------------------------------------

    def continue_as_new(self, input: Any) -> NoReturn:
        """End this run and start the task afresh with ``input`` and an empty journal:
        for a workflow that loops for ever (a subscription billed monthly for years),
        so that a wake-up replays its own iteration, not every earlier one. The task keeps
        its id, history and usage (budgets count across runs); the run number goes up
        (``show`` and the history tell it). Steps of earlier runs are never undone: a run
        that continues has finished. Only the main function may call it."""
        self._engine.continue_as_new(input)


def call_step(ctx: WorkflowContext, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a declared step or effect does when the main function calls it with ``ctx``:
    replayed from the journal, or run and committed."""
    if not isinstance(ctx, WorkflowContext):
        raise TypeError(
            f"{spec.kind} {spec.step_id!r} must be called from a workflow main function with "
            f"its ctx as first argument, got {validate.shown(ctx)}"
        )
    return ctx._engine.call(spec, args, kwargs)
