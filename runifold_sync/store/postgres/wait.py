"""How an idle PostgreSQL worker waits for work: on a pooled connection that LISTENs for
the length of one wait, on a direct connection of the store's own when a transaction
pooler is in the path (``listen_host``/``listen_port``), or by polling when there is no
such connection (see ``pgurl``). Each way re-reads the earliest due time (a timer, a
backoff, a lease expiry) after every wake-up, so a notification only means "look again".

On the pooled LISTEN connection a notification also says how much work it announces:
its payload is ``<transaction id>:<count>`` (query ``notify_work``; a task made
claimable by a worker's transition counts one). Every idle worker receives it, but only
``count`` of those that find work due go on to claim (:func:`wait_woken`): each takes
one of the notification's wake slots, a session advisory lock on its wait connection,
kept until that connection's next wait, so a worker that wakes late cannot take a slot
already used. One that finds no free slot looks again after :data:`WAKE_GRACE_S` and
claims only if work is still due then (the winner failed, or more came than
announced). One new task so wakes about one idle worker rather than all of them, whose
claims but one came back empty.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import psycopg

from ...errors import StoreUnavailable, StoreUsedAcrossFork
from .statements import Q
from .url import POLL_INTERVAL_S

log = logging.getLogger("runifold_sync.store")

DueIn = Callable[[], float | None]


def wait_until_due(due_in: DueIn, block: Callable[[float], None], timeout_s: float) -> bool:
    """True once a task is due (``due_in`` gives seconds until the earliest, ``None`` for
    none), False after ``timeout_s``; ``block`` sleeps up to the seconds it is given and
    may return early when something changed."""
    deadline = time.monotonic() + timeout_s
    while True:
        due_in_s = due_in()
        if due_in_s is not None and due_in_s <= 0:
            return True
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            return False
        block(remaining_s if due_in_s is None else min(remaining_s, due_in_s))


# How long a worker that found the wake slots of the work it woke for taken waits for
# their winners to claim it, before it claims whatever is still due.
WAKE_GRACE_S = 0.05
# At most this many workers wake for one notification, whatever it announces.
MAX_WAKE_SLOTS = 64


def wait_woken(conn: psycopg.Connection[Any], due_in: DueIn, timeout_s: float) -> bool:
    """:func:`wait_until_due` on ``conn``, which LISTENs: True at once when work is due
    at a look of its own (the first, a timer come due, a grace run out), and when due
    after notifications only once it takes one of their wake slots (see the module)."""
    deadline = time.monotonic() + timeout_s
    woken_by: list[str] = []  # the payloads of the notifications since the last look
    while True:
        due_in_s = due_in()
        block_s = due_in_s
        if due_in_s is not None and due_in_s <= 0:
            if not woken_by or _took_wake_slot(conn, woken_by):
                return True
            block_s = WAKE_GRACE_S  # others took the slots: let them claim first
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            return False
        woken_by = _notifications(conn, remaining_s if block_s is None else min(remaining_s, block_s))


def _notifications(conn: psycopg.Connection[Any], timeout_s: float) -> list[str]:
    """The payloads of the notifications on ``conn`` within ``timeout_s`` of the first."""
    payloads = [n.payload for n in conn.notifies(timeout=timeout_s, stop_after=1)]
    if payloads:
        payloads += [n.payload for n in conn.notifies(timeout=0)]
    return payloads


def _took_wake_slot(conn: psycopg.Connection[Any], payloads: list[str]) -> bool:
    """Take a free wake slot of one of the notifications ``payloads`` (True), held until
    ``release_wake_slots`` on this connection. A payload in no known form (a release
    that did not count its work) wakes as every notification did: True."""
    for payload in payloads:
        notifier, _, count = payload.partition(":")
        if not notifier or not count.isdigit():
            return True
        slots = min(int(count), MAX_WAKE_SLOTS)
        key = zlib.crc32(notifier.encode()) - 2**31  # an int4, for the two-key lock form
        if slots and conn.execute(Q["take_wake_slot"], {"key": key, "slots": slots}).fetchone():
            return True
    return False


def notified(conn: psycopg.Connection[object], timeout_s: float) -> None:
    """Return at the first notification on ``conn`` (which LISTENs), or after ``timeout_s``."""
    for _ in conn.notifies(timeout=timeout_s, stop_after=1):
        pass


def poll(timeout_s: float) -> None:
    time.sleep(min(timeout_s, POLL_INTERVAL_S))


class DirectListener:
    """A connection straight to the server that LISTENs on ``channel`` for as long as
    the store is open, for stores whose pool goes through a transaction pooler.

    It is opened at the first wait and reopened after a failure. It belongs to the
    process that opened the store: in a forked child it is neither used nor closed (its
    socket is the parent's). One thread waits on it at a time; another thread that waits
    meanwhile polls instead of queueing behind it."""

    def __init__(self, conninfo: str, channel: str, where: str) -> None:
        self.where = where
        self._conninfo = conninfo
        self._channel = channel
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[object] | None = None

    def wait(self, due_in: DueIn, timeout_s: float) -> bool:
        """:func:`wait_until_due`, woken by this connection's notifications."""
        if self._pid != os.getpid():
            raise StoreUsedAcrossFork(
                f"the LISTEN connection to {self.where} was opened in process {self._pid} and cannot "
                f"be used in forked process {os.getpid()}: open a new store in the child"
            )
        if not self._lock.acquire(blocking=False):
            return wait_until_due(due_in, poll, timeout_s)
        try:
            conn = self._listening()
            for _ in conn.notifies(timeout=0):  # drop what came before this look at the due time
                pass
            return wait_until_due(due_in, lambda s: notified(conn, s), timeout_s)
        except psycopg.Error as exc:
            self._drop()
            raise StoreUnavailable(f"LISTEN connection to {self.where}: {type(exc).__name__}: {exc}") from exc
        finally:
            self._lock.release()

    def _listening(self) -> psycopg.Connection[object]:
        if self._conn is None or self._conn.closed:
            conn: psycopg.Connection[object] = psycopg.connect(
                self._conninfo, autocommit=True, connect_timeout=10
            )
            conn.execute(f"LISTEN {self._channel}")
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                log.debug("closing a failed LISTEN connection to %s failed", self.where, exc_info=True)

    def close(self) -> None:
        """Close the connection (in the process that opened it; a child leaves it be)."""
        if self._pid == os.getpid():
            with self._lock:
                self._drop()
