"""Processes started beside a pool (the metrics exporter, the retention process):
exec'd, never forked, since the supervisor's process holds no connection and starts no
thread (see ``supervisor``), and stopped when the pool stops.

One that must keep running while the pool runs (the retention process) is a
:class:`KeptProcess`: started again, after a growing delay, when it dies. With no thread
in the supervisor's process, nothing notices a death by itself: the supervisor's loop
calls :meth:`KeptProcess.tend` on each pass (ten times a second), which only polls the
process's exit status (``waitpid`` on its pid, ``WNOHANG``) and starts it again when due.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

STOP_TIMEOUT_S = 10.0
FIRST_RESTART_S = 1.0  # the delay before the first restart after a death
MAX_RESTART_S = 60.0  # the delay doubles at each death in a row, up to this
STEADY_S = 60.0  # a process that ran this long before it died starts from the first delay again


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGTERM ``process`` and wait for it to finish what it has in hand; SIGKILL it
    after ``STOP_TIMEOUT_S``."""
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def exit_text(code: int) -> str:
    """``Popen.returncode`` as a log line says it: "exit code 3", or "exit code -9
    (SIGKILL)" for a process a signal ended."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"exit code {code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"exit code {code}"


class KeptProcess:
    """``command`` run with ``env`` beside a pool, started again when it dies until
    :meth:`stop`: after ``FIRST_RESTART_S``, doubling at each death in a row up to
    ``MAX_RESTART_S``, so one that cannot start (a broken install, a store refusing it)
    is not restarted in a tight loop. ``name`` says which process in the log lines."""

    def __init__(
        self, name: str, command: Sequence[str], env: Mapping[str, str], log: logging.Logger
    ) -> None:
        self.name = name
        self._command = list(command)
        self._env = dict(env)
        self._log = log
        self._delay_s = FIRST_RESTART_S
        self._restart_at: float | None = None
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(self._command, env=self._env)
        self._started = time.monotonic()

    @property
    def pid(self) -> int | None:
        """The running process's pid; None between a death and its restart."""
        return None if self._process is None else self._process.pid

    def tend(self) -> None:
        """Notice a death and schedule the restart, or restart when it is due."""
        now = time.monotonic()
        if self._process is None:
            if self._restart_at is not None and now >= self._restart_at:
                self._restart(now)
            return
        code = self._process.poll()
        if code is None:
            return
        if now - self._started >= STEADY_S:
            self._delay_s = FIRST_RESTART_S
        self._log.warning(
            "%s (pid %d) died with %s; restarting it in %.0f s",
            self.name,
            self._process.pid,
            exit_text(code),
            self._delay_s,
        )
        self._process = None
        self._restart_at = now + self._delay_s
        self._delay_s = min(self._delay_s * 2, MAX_RESTART_S)

    def _restart(self, now: float) -> None:
        try:
            self._process = subprocess.Popen(self._command, env=self._env)
        except OSError as exc:  # out of processes or memory: try again later
            self._log.warning(
                "%s could not be started again: %s; retrying in %.0f s", self.name, exc, self._delay_s
            )
            self._restart_at = now + self._delay_s
            self._delay_s = min(self._delay_s * 2, MAX_RESTART_S)
            return
        self._started, self._restart_at = now, None
        self.restarts += 1
        self._log.info("%s restarted (process %d)", self.name, self._process.pid)

    def stop(self) -> None:
        """Stop the process (:func:`stop`); none is started again."""
        process, self._process, self._restart_at = self._process, None, None
        if process is not None:
            stop(process)
