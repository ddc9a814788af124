"""SQLite store time: one clock for every process on the file, that never runs backwards.

A process's wall clock is no store clock: one started with its clock an hour ahead would
expire every other worker's lease at once, and a wall-clock step (an NTP correction, a
VM resumed) moves every lease and timer with it. The host's boot clock (Linux
``CLOCK_BOOTTIME``, read from ``/proc/uptime``, which no per-process clock shim or
wall-clock step changes) is the same for every process on the host and only moves
forward, suspend included. So the database keeps an anchor: the store time at some boot
clock reading, taken once per boot (``boot_id``), and store time is

    anchor_us + (boot clock now - anchor_uptime_us) + offset_us

The first process to open the file after a boot sets the anchor to its wall clock, but
never below a time already written to the database. After that, a wall-clock step
changes nothing until the next boot; ``clock`` in the CLI and the metrics show how far
this host's wall clock is from store time.

``/proc/uptime`` counts in hundredths of a second; each process reads it at a tick
(``_calibrate``), to learn the offset from its own ``time.monotonic_ns`` (which a clock shim may
shift but not speed up), and reads the monotonic clock from then on. Where there is no
``/proc`` (not Linux), store time is the wall clock, as the log says once.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

log = logging.getLogger("runifold_sync.store")

_UPTIME = Path("/proc/uptime")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
WALL_CLOCK_BOOT = "wall-clock"  # the boot id where store time follows the wall clock
_CALIBRATION_TICKS = 10
_NARROW_WINDOW_NS = 100_000

# The store-time expression every SQLite query uses (``{now}``): the anchor row, read by
# the statement, plus this process's boot clock as stamped for the statement.
NOW = "((SELECT anchor_us - anchor_uptime_us + offset_us FROM runifold_clock) + runifold_uptime_us())"


class HostClock:
    """This host's boot clock in microseconds, read through this process's monotonic
    clock once calibrated against ``/proc/uptime``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset_ns: int | None = None
        self.boot_id = (
            _BOOT_ID.read_text().strip() if _BOOT_ID.exists() and _UPTIME.exists() else WALL_CLOCK_BOOT
        )

    def uptime_us(self) -> int:
        if self.boot_id == WALL_CLOCK_BOOT:
            return time.time_ns() // 1000
        if self._offset_ns is None:
            with self._lock:
                if self._offset_ns is None:
                    self._offset_ns = _calibrate()
        return (time.monotonic_ns() + self._offset_ns) // 1000


def _calibrate() -> int:
    """Boot clock minus ``time.monotonic_ns``, read where ``/proc/uptime`` ticks.

    The tick falls between the start of the last read that still showed the old
    hundredth and the end of the first that shows the new one. On a busy host a read
    can be preempted for milliseconds, and two processes calibrated that loosely
    disagree on store time by as much (a task one worker just made due would be in
    another's future), so a tick counts only when that window is narrow; otherwise the
    narrowest of a few ticks (each about 10 ms apart) is used."""
    best_window_ns, best_offset_ns = None, 0
    for _ in range(_CALIBRATION_TICKS):
        last_old_started = time.monotonic_ns()
        first = _read_uptime_ns()
        while True:
            started = time.monotonic_ns()
            reading = _read_uptime_ns()
            if reading != first:
                break
            last_old_started = started
        ended = time.monotonic_ns()
        window_ns = ended - last_old_started
        if best_window_ns is None or window_ns < best_window_ns:
            best_window_ns, best_offset_ns = window_ns, reading - (last_old_started + ended) // 2
        if window_ns <= _NARROW_WINDOW_NS:
            break
    return best_offset_ns


def _read_uptime_ns() -> int:
    seconds, _, hundredths = _UPTIME.read_text().split()[0].partition(".")
    return int(seconds) * 1_000_000_000 + int(hundredths.ljust(2, "0")[:2]) * 10_000_000


HOST_CLOCK = HostClock()
if HOST_CLOCK.boot_id == WALL_CLOCK_BOOT:
    log.warning("no /proc/uptime here: SQLite store time follows this process's wall clock")


def anchor(conn: sqlite3.Connection, wall_us: int) -> None:
    """Inside the caller's write transaction: anchor the store clock to this boot if it
    is anchored to another (or never was). Store time then starts at this process's wall
    clock (plus the clock's offset), raised to just past the newest time the database
    holds, so it never runs back."""
    boot_id, offset_us = conn.execute("SELECT boot_id, offset_us FROM runifold_clock WHERE id = 1").fetchone()
    if boot_id == HOST_CLOCK.boot_id:
        return
    newest = conn.execute(
        "SELECT MAX(t) FROM (SELECT MAX(updated_at) AS t FROM runifold_tasks "
        "UNION ALL SELECT MAX(last_seen) FROM runifold_workers)"
    ).fetchone()[0]
    starts_at = max(wall_us + offset_us, (newest or 0) + 1)
    conn.execute(
        "UPDATE runifold_clock SET boot_id = ?, anchor_us = ?, anchor_uptime_us = ? WHERE id = 1",
        (HOST_CLOCK.boot_id, starts_at - offset_us, HOST_CLOCK.uptime_us()),
    )
