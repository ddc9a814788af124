"""One LISTEN connection per PostgreSQL store for every caller blocked in
``store.wait_for_task`` or ``store.get_event``: a hundred request threads waiting for a
hundred tasks hold one server connection between them, not a hundred, and none of the
pool's.

The transitions that end a task (complete, fail, acknowledge_cancel, an operator's
cancel of an unleased task) and ``ctx.set_event`` call ``pg_notify`` on
:data:`CHANNEL` with the task id in the statement that makes the change, so the
notification is delivered when that transaction commits, never before the row can be
read; a task's end only once a waiter has marked it awaited (the store's ``watch``
does, after this connection listens), since a NOTIFY at every completion serialized a
pool's commits on the server's notification queue. A :class:`ResultListener` keeps the
connection (opened at the first wait, straight to the server or through a session
pooler; behind a transaction pooler to ``listen_host``/``listen_port``, see ``pgurl``)
and a daemon thread that reads it and sets the ``threading.Event`` of each watch of the
notified task.

A notification can be missed only while no connection listens. So whenever one starts
listening (the first, or a new one after a failure) its generation goes up, and a watch
made under an older generation returns at once: its caller reads the task again. A
failing connection wakes every watch on its way out for the same reason.

The listener belongs to the process that opened the store: in a forked child it raises
:class:`StoreUsedAcrossFork` and is never closed from there (its socket and thread are
the parent's).
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from ...errors import StoreClosed, StoreUnavailable, StoreUsedAcrossFork

CHANNEL = "runifold_results"  # named in the statements of sql/postgres.sql as well
log = logging.getLogger("runifold_sync.store")


class ResultListener:
    """The shared LISTEN connection of one store on ``conninfo`` (``where`` names it in
    errors); ``connects`` counts the connections it opened."""

    def __init__(self, conninfo: str, where: str) -> None:
        self.where = where
        self.connects = 0
        self._conninfo = conninfo
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._conn: psycopg.Connection[Any] | None = None  # None: nothing listens now
        self._thread: threading.Thread | None = None
        self._stop: tuple[int, int] | None = None  # a pipe that wakes the thread to stop
        self._generation = 0
        self._closed = False

    @contextmanager
    def watch(self, task_id: str) -> Iterator[NotifiedWatch]:
        """A watch of ``task_id``, listening before the caller first reads the task."""
        event = threading.Event()
        generation = self.listening()
        with self._lock:
            self._waiters.setdefault(task_id, set()).add(event)
        try:
            yield NotifiedWatch(self, event, generation)
        finally:
            with self._lock:
                waiters = self._waiters.get(task_id)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[task_id]

    @property
    def watches(self) -> int:
        """How many watches are open now, over every task (what a diagnosis asks first)."""
        with self._lock:
            return sum(len(events) for events in self._waiters.values())

    def listening(self) -> int:
        """The generation of the connection listening now, opened here if none is."""
        if self._pid != os.getpid():
            raise StoreUsedAcrossFork(
                f"the LISTEN connection to {self.where} was opened in process {self._pid} and cannot "
                f"be used in forked process {os.getpid()}: open a new store in the child"
            )
        with self._lock:
            if self._closed:
                raise StoreClosed(f"store on {self.where} is closed")
            if self._conn is None:
                self._start()
            return self._generation

    def _start(self) -> None:
        """Open and LISTEN, then hand the connection to a new reading thread (caller
        holds the lock; the previous thread, if any, has let its connection go)."""
        try:
            conn: psycopg.Connection[Any] = psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=10
            )
            try:
                conn.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error:
                conn.close()
                raise
        except psycopg.Error as exc:
            raise StoreUnavailable(f"LISTEN connection to {self.where}: {type(exc).__name__}: {exc}") from exc
        if self._stop is None:
            self._stop = os.pipe()
        self._conn = conn
        self._generation += 1
        self.connects += 1
        self._thread = threading.Thread(
            target=self._read, args=(conn, self._stop[0]), name="runifold-results-listener", daemon=True
        )
        self._thread.start()

    def _read(self, conn: psycopg.Connection[Any], stop: int) -> None:
        """The thread: wake the watches of each notified task until told to stop or the
        connection fails, then wake every watch (what comes next is not heard)."""
        try:
            with selectors.DefaultSelector() as selector:  # not select(): fds past 1024
                selector.register(conn.fileno(), selectors.EVENT_READ, "notified")
                selector.register(stop, selectors.EVENT_READ, "stop")
                while True:
                    if "stop" in {key.data for key, _ in selector.select()}:
                        return
                    for notify in conn.notifies(timeout=0):
                        self._wake(self._waiters_of(notify.payload))
        except (psycopg.Error, OSError, ValueError) as exc:
            log.debug("the LISTEN connection to %s failed: %s", self.where, exc)
        finally:
            with self._lock:
                if self._conn is conn:
                    self._conn = None
                everyone = [event for events in self._waiters.values() for event in events]
            self._wake(everyone)
            try:
                conn.close()
            except psycopg.Error:
                log.debug("closing the LISTEN connection to %s failed", self.where, exc_info=True)

    def _waiters_of(self, task_id: str) -> list[threading.Event]:
        with self._lock:
            return list(self._waiters.get(task_id, ()))

    @staticmethod
    def _wake(events: list[threading.Event]) -> None:
        for event in events:
            event.set()

    def close(self) -> None:
        """Stop the thread and close the connection (in the process that opened them; a
        forked child leaves them be)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, stop = self._thread, self._stop
        if thread is not None and stop is not None:
            os.write(stop[1], b"x")
            thread.join(timeout=10)
        if stop is not None:
            os.close(stop[0])
            os.close(stop[1])


class NotifiedWatch:
    """One caller's :class:`~runifold_sync.store.watch.Watch` on a :class:`ResultListener`."""

    def __init__(self, listener: ResultListener, event: threading.Event, generation: int) -> None:
        self._listener = listener
        self._event = event
        self._generation = generation

    def wait(self, timeout_s: float) -> None:
        generation = self._listener.listening()  # reconnects after a failure
        if generation != self._generation:  # nothing listened for a while: look again now
            self._generation = generation
            return
        self._event.wait(timeout_s)
        self._event.clear()  # before the caller reads again, so a later wake is kept
