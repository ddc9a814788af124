"""Processes started beside a pool (the metrics exporter, the retention process):
exec'd, never forked, since the supervisor's process holds no connection and starts no
thread (see ``supervisor``), and stopped when the pool stops."""

from __future__ import annotations

import subprocess

STOP_TIMEOUT_S = 10.0


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGTERM ``process`` and wait for it to finish what it has in hand; SIGKILL it
    after ``STOP_TIMEOUT_S``."""
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
