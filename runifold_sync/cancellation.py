"""``CancellationToken``: the one stop flag shared by a worker loop, a supervisor and
their signal handlers.

A leaf module (it imports nothing from the package), so the worker and the supervisor
can both depend on it without depending on each other.
"""

from __future__ import annotations

import threading


class CancellationToken:
    """A one-way stop flag that signal handlers may set (they only call ``cancel``)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True as soon as the token is cancelled."""
        return self._event.wait(timeout_s)
