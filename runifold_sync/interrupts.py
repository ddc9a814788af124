"""How control leaves a workflow's main function early.

Each is raised by the replay engine (``engine.py`` and its parts) and turned by the
worker into one store transition. They derive from ``BaseException`` so that
``except Exception`` in workflow code cannot swallow a suspension, a cancel or a lost
lease.
"""

from __future__ import annotations

from datetime import datetime

from .errors import LeaseLostError
from .outcomes import FailureCause


class Interrupt(BaseException):
    """Ends the main function early; the worker turns it into a store transition."""


class SuspendRequested(Interrupt):
    def __init__(self, wake_at: datetime | None, reason: str, signal: str | None = None) -> None:
        self.wake_at = wake_at
        self.reason = reason
        self.signal = signal


class CancelRequested(Interrupt):
    """``store.cancel()`` reached this task; it stops at this step boundary."""


class BranchStopped(Interrupt):
    """A parallel branch was told to stop (a sibling failed, or it lost a race)."""


class RetryRequested(Interrupt):
    def __init__(self, delay_s: float, reason: str) -> None:
        self.delay_s = delay_s
        self.reason = reason


class FailRequested(Interrupt):
    def __init__(self, reason: str, ambiguous_effect: str | None = None, *, cause: FailureCause) -> None:
        self.reason = reason
        self.ambiguous_effect = ambiguous_effect
        self.cause = cause


class YieldRequested(Interrupt):
    """The per-claim step slice is used up."""


class LeaseGone(Interrupt):
    def __init__(self, error: LeaseLostError) -> None:
        self.error = error
