"""How a failing step is retried: how many attempts, the backoff between them, and which
errors no retry can mend."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from datetime import timedelta
from typing import ClassVar

import attrs

from ..errors import InvalidArgument
from . import validate


def _exception_classes(value: object) -> tuple[type[Exception], ...]:
    """``RetryPolicy.non_retryable`` as a tuple of ``Exception`` subclasses: a step's
    ``BaseException`` (a ``KeyboardInterrupt``, a ``SystemExit``) ends its worker, never
    reaches the policy, so naming one would promise what cannot happen."""
    field = "RetryPolicy.non_retryable"
    if isinstance(value, (str, bytes, type)) or not isinstance(value, Iterable):
        raise InvalidArgument(
            f"{field} must be a tuple of exception classes, got {validate.shown(value)}"
            + (f"; write ({value.__name__},)" if isinstance(value, type) else "")
        )
    classes = tuple(value)
    for position, cls in enumerate(classes):
        if not isinstance(cls, type) or not issubclass(cls, BaseException):
            raise InvalidArgument(
                f"{field} must hold exception classes, got {validate.shown(cls)} at position {position}"
            )
        if not issubclass(cls, Exception):
            raise InvalidArgument(
                f"{field} may hold only subclasses of Exception, got {cls.__name__} at position "
                f"{position}: a step raising it stops its worker, not its retries"
            )
    return classes


@attrs.frozen
class RetryPolicy:
    """How often a failing step is retried, with exponential backoff and jitter.

    A step that raises an instance of a ``non_retryable`` class fails its task at once,
    whatever ``max_attempts`` says. The default holds the programming errors
    (``PROGRAMMING_ERRORS``: ``TypeError``, ``AttributeError``, ``NameError``),
    which a retry repeats instead of mending; ``non_retryable=()`` retries everything, and
    ``(*RetryPolicy.PROGRAMMING_ERRORS, MyError)`` adds to them."""

    # What a retry cannot mend: a step that raises one of these will raise it again, since
    # every attempt runs the same code on the same arguments.
    PROGRAMMING_ERRORS: ClassVar[tuple[type[Exception], ...]] = (TypeError, AttributeError, NameError)

    max_attempts: int = validate.field(validate.count, 3, prefix=True)
    initial_backoff: timedelta = validate.field(validate.positive_duration, timedelta(seconds=1))
    max_backoff: timedelta = validate.field(validate.positive_duration, timedelta(minutes=5))
    multiplier: float = validate.field(validate.number, 2.0, name="RetryPolicy.multiplier")
    jitter: float = 0.2
    non_retryable: tuple[type[Exception], ...] = attrs.field(
        default=PROGRAMMING_ERRORS, converter=_exception_classes
    )

    def __attrs_post_init__(self) -> None:
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, (int, float))
            or not 0 <= self.jitter < 1
        ):
            validate.refuse("jitter", "a number in [0, 1)", self.jitter)

    def backoff_s(self, failures: int) -> float:
        """Delay before the attempt after ``failures`` failures; jitter spreads a herd.
        The growth is capped before it is computed (``multiplier ** n`` overflows a float
        past n of about 1,000 at 2.0), and the jittered delay at the longest a store
        accepts (a ``max_backoff`` near it would otherwise be refused with jitter)."""
        initial, cap = self.initial_backoff.total_seconds(), self.max_backoff.total_seconds()
        exponent = max(failures - 1, 0)
        if initial >= cap or (
            self.multiplier > 1 and exponent >= math.log(cap / initial) / math.log(self.multiplier)
        ):
            base = cap  # initial * multiplier ** exponent would reach the cap (or overflow)
        else:  # below the cap: multiplier ** exponent < cap / initial, or at most 1
            base = min(initial * self.multiplier**exponent, cap)
        jittered = base * random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(jittered, validate.MAX_DURATION.total_seconds())
