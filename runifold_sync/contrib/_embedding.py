"""What the Flask and Django integrations share beyond :mod:`runifold_sync.runner`: a
store opened once per process.

Fork safety: a web server may fork after the application opened its store (gunicorn
``--preload``, uwsgi). :class:`ProcessStore` remembers the pid that opened the store and
opens a new one in any other process; it never uses, nor closes, a parent's store.
"""

from __future__ import annotations

import os
import threading

from ..store.base import WorkflowStore
from ..store.open import open_store

# One lock for every ProcessStore, replaced in a forked child: a thread of the parent may
# have held it at the moment of the fork, and that thread does not exist in the child.
_open_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


class ProcessStore:
    """A store opened lazily, once per process and URL, shared by the process's threads."""

    def __init__(self) -> None:
        # (pid, url, store) in one attribute, so a reader never sees a store with the pid
        # or URL of another.
        self._opened: tuple[int, str, WorkflowStore] | None = None

    def get(self, url: str) -> WorkflowStore:
        opened = self._opened
        if opened is not None and opened[0] == os.getpid() and opened[1] == url:
            return opened[2]
        with _open_lock:
            opened = self._opened
            pid = os.getpid()
            if opened is not None and opened[0] == pid and opened[1] == url:
                return opened[2]
            store = open_store(url)
            self._opened = (pid, url, store)
        if opened is not None and opened[0] == pid:
            opened[2].close()  # the URL changed (a test overriding settings); the old one is ours
        # A store of another pid was opened by a parent before fork: dropped, never closed,
        # because closing it here could end the parent's connections.
        return store

    @property
    def pid(self) -> int | None:
        """The pid that opened the current store, or None if none is open."""
        opened = self._opened
        return None if opened is None else opened[0]

    def close(self) -> None:
        """Close the store if this process opened it; forget a parent's. Idempotent."""
        with _open_lock:
            opened, self._opened = self._opened, None
        if opened is not None and opened[0] == os.getpid():
            opened[2].close()
