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

from ..errors import InvalidArgument
from ..model import validate
from ..model.attributes import AttributeValue
from ..model.values import Budget
from .waiting import (
    ApprovalDecision,
    ApprovalTimedOut,
    ChildHandle,
    ChildStart,
    ChildTimedOut,
    Fired,
    SignalReceived,
    SignalTimedOut,
    Update,
    WaitItem,
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
        self,
        name: str,
        version: int,
        input: Any,
        checkpoint_id: str | None,
        tenant: str | None,
        queue: str,
        detached: bool = False,
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

    def now(self) -> datetime: ...

    def wait_any(self, items: tuple[WaitItem, ...], result_type: Any, payload_type: Any) -> Fired: ...

    def wait_for_signals(
        self, names: tuple[str, ...], timeout: timedelta | None, until: datetime | None, payload_type: Any
    ) -> Any: ...

    def patched(self, change_id: str) -> bool: ...

    def deprecate_patch(self, change_id: str) -> None: ...

    def set_attributes(self, values: Mapping[str, Any]) -> None: ...

    def write_stream(self, key: str, value: Any) -> None: ...

    def wait_for_update(
        self, name: str, timeout: timedelta | None, payload_type: Any
    ) -> Update | SignalTimedOut: ...

    def reply(self, update: Update, value: Any) -> None: ...


def _patch_id(field: str, value: object) -> str:
    """A patch's change id names a journal marker, as a step id names an entry: a name
    (:func:`validate.name`) without ``#`` or ``/``."""
    text = validate.name(field, value)
    if "#" in text or "/" in text:
        validate.refuse(field, "a name without '#' or '/'", text)
    return text


def patch_id(value: object) -> str:
    """``value`` as a patch's change id (``ctx.patched``, ``@workflow.step(patch=)``)."""
    return _patch_id("patch change id", value)


def _signal_names(field: str, value: object) -> tuple[str, ...]:
    """What a signal wait waits for: one name, or a non-empty list of distinct names
    (the wait ends at the first of them to arrive)."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not value:
        validate.refuse(field, "a name or a non-empty list of names", value)
    if not all(isinstance(one, str) for one in value):
        validate.refuse(f"{field}s", "strings", value)
    if len(set(value)) != len(value):
        validate.refuse(f"{field}s", "distinct", value)
    return tuple(value)


def _wait_until(what: str, timeout: object, until: object) -> datetime | None:
    """A wait's ``until``: None, or a moment a store can hold; never with ``timeout`` too
    (one deadline per wait)."""
    if until is None:
        return None
    if timeout is not None:
        raise InvalidArgument(
            f"{what} takes timeout or until, not both, got {validate.shown(timeout)} "
            f"and {validate.shown(until)}"
        )
    return validate.moment(f"{what} until", until)


def _wait_items(items: object) -> tuple[WaitItem, ...]:
    """``ctx.wait_any``'s list: non-empty, each a ChildHandle, a signal name, a positive
    timedelta or a moment, no child or name twice."""
    if isinstance(items, (str, ChildHandle)) or not isinstance(items, (list, tuple)) or not items:
        what = "a non-empty list of child handles, signal names and timers (timedelta or datetime)"
        validate.refuse("wait_any items", what, items)
    seen: set[object] = set()
    for item in items:
        if isinstance(item, ChildHandle):
            key: object = ("child", item.task_id)
        elif isinstance(item, str):
            key = ("signal", item)
        elif isinstance(item, timedelta):
            validate.positive_duration("wait_any timer", item)
            continue
        elif isinstance(item, datetime):
            validate.moment("wait_any timer", item)
            continue
        else:
            validate.refuse("wait_any item", "a child handle, a signal name, a timedelta or a datetime", item)
        if key in seen:
            validate.refuse("wait_any items", "distinct", items)
        seen.add(key)
    return tuple(items)


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

    def wait_for_signal(
        self,
        name: str | Sequence[str],
        *,
        timeout: timedelta | None = None,
        until: datetime | None = None,
        payload_type: Any = Any,
    ) -> Any:
        """Wait durably for a signal named ``name`` (declared on the workflow). Returns its
        payload, structured as ``payload_type``, or :class:`SignalTimedOut`. A signal sent
        before the wait is kept for it; the definition's sender policy may refuse one.

        ``name`` may be a list of names: the first of them to arrive ends the wait, which
        then returns a :class:`SignalReceived` (its name and payload); the others stay
        pending for a later wait. The deadline is ``timeout`` from the wait's start or
        the moment ``until`` (store time), not both."""
        names = _signal_names("signal wait name", name)
        timeout = _wait_timeout("signal timeout", timeout)
        deadline = _wait_until("signal wait", timeout, until)
        if isinstance(name, str) and deadline is None:
            return self._engine.wait_for_signal(name, timeout, payload_type)
        received = self._engine.wait_for_signals(names, timeout, deadline, payload_type)
        if isinstance(name, str) and isinstance(received, SignalReceived):
            return received.payload
        return received

    def wait_for_update(
        self, name: str, *, timeout: timedelta | None = None, payload_type: Any = Any
    ) -> Update | SignalTimedOut:
        """Wait durably for an update named ``name`` (a declared signal a caller sends
        with ``store.update``). Each one is first checked by the workflow's validator
        (``@workflow.validator(name)``), its payload structured as ``payload_type``: a
        rejected update is taken out and not recorded (the caller gets
        :class:`UpdateRejected`), and the wait goes on; an accepted one is recorded and
        returned as an :class:`Update`, to be answered with :meth:`reply`.
        :class:`SignalTimedOut` when ``timeout`` passed first."""
        return self._engine.wait_for_update(name, _wait_timeout("update timeout", timeout), payload_type)

    def reply(self, update: Update, value: Any) -> None:
        """Answer ``update`` with ``value`` (JSON, at most 64 KiB encoded): the caller's
        ``store.update`` returns it. Committed before the call returns, with the progress
        made so far, as :meth:`set_event` is (same replay rule)."""
        validate.instance("update (the Update wait_for_update returned)", update, Update)
        self._engine.reply(update, value)

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
        detached: bool = False,
    ) -> ChildHandle:
        """Enqueue a task of ``name`` at ``version`` as this task's child, once: a replay
        returns the same handle. Its id is ``checkpoint_id``, else derived from this
        task's id and the call's. It runs on its own (its own budget and retries; this
        task's tenant unless ``tenant``; on the named ``queue``, ``default`` unless given,
        whatever this task's queue) until waited for with :meth:`wait_child`.
        Cancelling this task cancels its unfinished children, except a ``detached`` one,
        which runs on to its own end (it stays this task's child: listed, waitable)."""
        validate.flag("detached", detached)
        return self._engine.start_child(name, version, input, checkpoint_id, tenant, queue, detached)

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

    def wait_any(
        self, items: Sequence[WaitItem], *, result_type: Any = Any, payload_type: Any = Any
    ) -> Fired:
        """Wait durably (the worker is freed) for the first of ``items`` to fire: a child
        (:class:`ChildHandle`) that ends, a signal name (declared on the workflow) that
        arrives, or a timer (a ``timedelta`` from the wait's start, or a ``datetime``).
        Returns :class:`Fired`: its index in ``items``, the item and its value (the
        child's result as ``result_type``, or its :class:`ChildFailed`, returned, not
        raised; the payload as ``payload_type``; None for a timer). When several are
        ready at once the first in ``items`` wins. What fired is committed before the
        call returns, and a replay returns it again; the others are left as they are (a
        signal stays pending, a child runs on)."""
        return self._engine.wait_any(_wait_items(items), result_type, payload_type)

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

    # --- changing running code -------------------------------------------------------

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new path of the change ``change_id``: ``if
        ctx.patched("x"): new path, else: old path``. A run that reaches this call for
        the first time records a marker in its journal and gets True; a run whose journal
        already goes on past this point without the marker (it began under the old code)
        gets False and keeps its old path; a replay answers what was recorded, and later
        calls with the same id in this run answer as the first. Steps called only on the
        new path are declared with ``patch="x"`` so the definition's fingerprint stays
        and the running tasks are not stranded. A worker still on the old code that meets
        the marker hands the task back for one that has the patch."""
        return self._engine.patched(patch_id(change_id))

    def deprecate_patch(self, change_id: str) -> None:
        """Once no run without the marker of ``change_id`` is left (``versions`` lists
        them), replace ``if ctx.patched(x): new else: old`` by ``ctx.deprecate_patch(x)``
        then the new path: runs that recorded the marker pass it, new runs record none.
        When no run that recorded it is left either, the call can go."""
        self._engine.deprecate_patch(patch_id(change_id))

    # --- time ------------------------------------------------------------------------

    def now(self) -> datetime:
        """Store time (UTC) as recorded for this point of the run: the first run reads the
        store's clock and records it in the journal; every replay returns the recorded
        value, so code that branches on the time takes the same branch again. No write of
        its own: the record is committed with the next commit (a step's, an effect's
        intent, an event, a wait); a crash before that loses it together with whatever
        used it, and the replay reads the clock afresh."""
        return self._engine.now()

    # --- search attributes and streams ---------------------------------------------

    def set_attributes(self, **values: AttributeValue) -> None:
        """Set this task's search attributes: ``ctx.set_attributes(customer="c-42",
        amount=120)``. Each value is text, an integer, a number, a boolean or an aware
        datetime (kept as that kind); a key set again takes the new value. Operators find
        the task by them: ``store.list_tasks(attributes={"customer": "c-42"})``, ``list
        --where customer=c-42``, the dashboard's task list; ``store.task_attributes``
        reads them. Committed before the call returns, with the progress made so far, as
        :meth:`set_event` is (same replay rule); one fenced write, none when replayed."""
        self._engine.set_attributes(values)

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` (JSON, at most 64 KiB encoded) to this task's stream ``key``
        (a name): progress or partial results a caller reads in order, as they come, with
        ``store.read_stream(task_id, key, after=offset, timeout=...)``; the stream is
        closed once the task finishes. Committed before the call returns, with the
        progress made so far, and appended once whatever crashes where (a replayed call
        writes nothing; one made again at the journal's end is recognised). The main
        function only; one fenced write a call."""
        self._engine.write_stream(key, value)

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
