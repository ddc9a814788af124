"""How long a store call may take, and trying it again when the store did not answer.

A worker that holds a lease must not block in a store call past the lease's end (its
lease would run out while it waits, and its task go to another worker), and must not
give up its task for one dropped connection either. So the code that holds a lease says,
for its thread, until when its calls may go on (:func:`retrying_until`):

- the PostgreSQL store bounds each attempt by it (``pgpool``): a statement whose answer
  does not come in time closes its connection and fails;
- the worker's operations written with :func:`retried` try again at once, on a fresh
  connection, while time is left. A fenced write is safe to send again: its token and
  revision checks refuse a second application, and a refusal that follows an attempt
  whose answer was lost is checked against the row, since that attempt may have applied
  (the ``applied`` argument). Reads and lease extensions are safe as they are.

Outside such a block (producers, operators, a worker between tasks) those operations
are sent again once, at once, when the server dropped the connection under them
(:class:`ConnectionDropped`: a terminated backend); a worker's loop retries its failed
cycle itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TypeVar

import attrs

from ..errors import LeaseLostError, StoreUnavailable
from .outage import is_outage

log = logging.getLogger("runifold_sync.store")

T = TypeVar("T")

# A call made once its patience has run out still gets one attempt this long (unless
# the patience names a shorter one): the store's answer to a fenced write (refused, most
# often) is worth more than the local clock's guess, and the fence makes it harmless.
LATE_ATTEMPT_S = 1.0
# After the second failed attempt in a row, a pause before the next, growing to at most
# _PAUSE_MAX_S: a refused connection fails at once, and the pool's reconnection needs a
# moment. The first retry is immediate (a connection the server dropped).
_PAUSE_S = 0.05
_PAUSE_MAX_S = 0.5


class ConnectionDropped(StoreUnavailable):
    """The server closed the connection while a call used it (a terminated backend): the
    store itself may well answer on a fresh one."""


@attrs.frozen
class Patience:
    """Until when (``until()``, monotonic, read again at each attempt: a heartbeat moves a
    lease's end) this thread's store calls may go on, and how long one attempt may take
    (``attempt_s``; None: the store's own bound)."""

    until: Callable[[], float]
    attempt_s: float | None = None


_PATIENCE: ContextVar[Patience | None] = ContextVar("runifold_store_patience", default=None)


def retrying_until(
    until: float | Callable[[], float], attempt_s: float | None = None
) -> AbstractContextManager[None]:
    """Within the block, this thread's store calls end by ``until`` (monotonic time, or a
    function giving it when it moves), each attempt within ``attempt_s`` when given, and
    the operations written with :func:`retried` try again while time is left."""
    if not callable(until):
        fixed = until
        until = lambda: fixed  # noqa: E731
    return _Patient(Patience(until, attempt_s))


class _Patient:
    """The block of :func:`retrying_until`: a class rather than a generator, since every
    claim's run enters one (a generator's context manager took five calls in and out)."""

    __slots__ = ("_patience", "_token")

    def __init__(self, patience: Patience) -> None:
        self._patience = patience

    def __enter__(self) -> None:
        self._token = _PATIENCE.set(self._patience)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        _PATIENCE.reset(self._token)


def attempt_deadline(bound_s: float | None) -> float | None:
    """The monotonic time by which a store call starting now must have its answer: within
    ``bound_s`` (the store's own bound, None for none) and the thread's patience."""
    now = time.monotonic()
    deadline = None if bound_s is None else now + bound_s
    patience = _PATIENCE.get()
    if patience is None:
        return deadline
    end = patience.until()
    if end <= now:
        end = now + (
            LATE_ATTEMPT_S if patience.attempt_s is None else min(patience.attempt_s, LATE_ATTEMPT_S)
        )
    elif patience.attempt_s is not None:
        end = min(end, now + patience.attempt_s)
    return end if deadline is None else min(deadline, end)


def retried(attempt: Callable[[], T], applied: Callable[[], T | None] | None = None) -> T:
    """``attempt()``, tried again while it fails for an outage and the thread's patience
    leaves time (outside :func:`retrying_until`, once after a :class:`ConnectionDropped`
    only). When an attempt after a
    failed one is refused with :class:`LeaseLostError`, ``applied()`` says whether the
    failed attempt had applied the write after all (its answer lost with its
    connection): its answer then, or None when it had not."""
    failures = 0
    while True:
        try:
            return attempt()
        except LeaseLostError:
            if failures and applied is not None:
                found = retried(applied)
                if found is not None:
                    return found
            raise
        except StoreUnavailable as exc:
            patience = _PATIENCE.get()
            if not is_outage(exc):
                raise
            if patience is None:
                if failures or not isinstance(exc, ConnectionDropped):
                    raise
                failures += 1
                continue
            left_s = patience.until() - time.monotonic()
            if left_s <= 0:
                raise
            failures += 1
            log.debug("store call failed (%s); trying again, %.1f s left", exc, left_s)
            if failures > 1:
                time.sleep(min(_PAUSE_S * 2 ** (failures - 2), _PAUSE_MAX_S, left_s))
