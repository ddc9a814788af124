"""How control leaves a workflow's main function early.

Each is raised by the replay engine (``engine.py`` and its parts) and turned by the
worker into one store transition. They derive from ``BaseException`` so that
``except Exception`` in workflow code cannot swallow a suspension, a cancel, a failure
or a lost lease.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import cast

from ..errors import AmbiguousEffect, LeaseLostError, StepFailed, StoreUnavailable
from ..model.outcomes import FailureCause


class Interrupt(BaseException):
    """Ends the main function early; the worker turns it into a store transition."""


class SuspendRequested(Interrupt):
    """Wait until ``wake_at``, for signal ``signal`` or for child task ``child`` to end;
    ``approvers`` when that signal is an approval only they may decide (the store then
    refuses anyone else's)."""

    def __init__(
        self,
        wake_at: datetime | None,
        reason: str,
        signal: str | None = None,
        approvers: frozenset[str] | None = None,
        child: str | None = None,
    ) -> None:
        self.wake_at = wake_at
        self.reason = reason
        self.signal = signal
        self.approvers = approvers
        self.child = child


class PauseRequested(SuspendRequested):
    """``store.pause()`` reached this task: it parks at this step boundary, waiting with
    no deadline, until ``store.resume()`` makes it due again."""

    def __init__(self) -> None:
        super().__init__(None, "paused at a step boundary")


class CancelRequested(Interrupt):
    """``store.cancel()`` reached this task; it stops at this step boundary."""


class BranchStopped(Interrupt):
    """A parallel branch was told to stop (a sibling failed, or it lost a race)."""


class RetryRequested(Interrupt):
    def __init__(self, delay_s: float, reason: str) -> None:
        self.delay_s = delay_s
        self.reason = reason


class FailRequested(Interrupt):
    """Ends the task failed with ``reason``. ``error`` is what failed: the RunifoldError
    naming the condition (non-determinism, an ambiguous effect...), or the exception a
    step, effect, compensation or the main function raised; None when a limit was reached
    and nothing raised. ``step_id`` and ``effect_key`` name the call it failed in."""

    def __init__(
        self,
        reason: str,
        *,
        cause: FailureCause,
        error: Exception | None = None,
        step_id: str | None = None,
        effect_key: str | None = None,
    ) -> None:
        self.reason = reason
        self.cause = cause
        self.error = error
        self.step_id = step_id
        self.effect_key = effect_key

    @property
    def ambiguous_effect(self) -> str | None:
        """The key of the effect whose outcome is unknown: the task stays recoverable
        through ``resolve_effect``."""
        return self.error.key if isinstance(self.error, AmbiguousEffect) else None


class UnknownPatch(Interrupt):
    """Replay met the marker ``marker`` of a patch at ``position`` where this code makes
    call ``call_id``: the run took a patched path that this worker's code does not have
    (an older deploy still serving). The worker hands the task back for one that has it
    instead of failing it as non-deterministic."""

    def __init__(self, marker: str, position: int, call_id: str) -> None:
        super().__init__(marker, position, call_id)
        self.marker = marker
        self.position = position
        self.call_id = call_id

    @property
    def reason(self) -> str:
        return (
            f"the run recorded {self.marker!r} at position {self.position}, where this code calls "
            f"{self.call_id!r}: it needs a worker whose code has that patch"
        )


def uncaught(failed: StepFailed) -> FailRequested:
    """The task's failure when a StepFailed leaves the main function (or a branch)
    uncaught: the failure the step would have ended the task with had nothing been able
    to catch it, the same on the claim that raised it and on a replay."""
    return FailRequested(
        failed.reason,
        cause=cast(FailureCause, failed.cause),
        error=failed,
        step_id=failed.step_id,
        effect_key=failed.effect_key,
    )


class ContinueRequested(Interrupt):
    """``ctx.continue_as_new``: end this run and queue the task afresh with this input."""

    def __init__(self, input_json: str) -> None:
        self.input_json = input_json


class YieldRequested(Interrupt):
    """Hand the task back at this step boundary, unfinished: the per-claim step slice is
    used up, or the worker must stop soon (its supervisor is gone); ``reason`` says which."""

    def __init__(self, reason: str = "step slice used up; requeued") -> None:
        super().__init__(reason)
        self.reason = reason


class Unwind(Interrupt):
    """Carries a store error out through user code, where ``except Exception`` must not
    stop it: a lost lease (``LeaseLostError``, which outranks anything else that ends the
    cycle) or, out of a parallel branch, an unreachable store (``StoreUnavailable``, raised
    again as itself once the siblings stopped). The condition is the error; this is only
    how it travels."""

    def __init__(self, error: LeaseLostError | StoreUnavailable) -> None:
        super().__init__(error)
        self.error = error


class _Unwound:
    """See :func:`unwound`: a class with no state, one instance shared, since every claim
    enters it (a generator's context manager took five calls in and out)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Unwind):
            raise exc.error from None


_UNWOUND = _Unwound()


def unwound() -> AbstractContextManager[None]:
    """Out of user code, an ``Unwind`` is raised as the error it carries, so the worker
    handles one condition under one name wherever it was found."""
    return _UNWOUND
