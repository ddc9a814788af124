"""The harness for subprocess apps (``python -m tests.<dir>.<name>_app`` and the CLI):
start one from the repository root, wait for what it writes, stop or kill it, and reap
whatever a test leaves running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.02
Output = int | IO[str] | IO[bytes] | None


def command(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def spawn(
    module: str,
    *args: str,
    stdout: Output = subprocess.PIPE,
    stderr: Output = None,
    env: Mapping[str, str] | None = None,
    own_session: bool = False,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[str]:
    """Start ``python -m module args`` from the repository root, its output as text.

    ``own_session`` starts it in a session of its own, so :func:`kill` ends the children
    it forks too (a supervisor's workers)."""
    return subprocess.Popen(
        command(module, *args),
        cwd=ROOT,
        stdout=stdout,
        stderr=stderr,
        env=None if env is None else dict(env),
        text=True,
        start_new_session=own_session,
        pass_fds=pass_fds,
    )


def run(
    module: str, *args: str, timeout_s: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` from the repository root to its end, output captured."""
    return subprocess.run(
        command(module, *args),
        cwd=ROOT,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def wait_until(
    condition: Callable[[], object], timeout_s: float, what: str, *, poll_s: float = POLL_S
) -> None:
    """Poll ``condition`` until it holds; fail (``AssertionError``) naming ``what`` when
    ``timeout_s`` passes first. (No pytest here: the apps that import this module run
    outside pytest.)"""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def kill(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and, when it leads a session of its own, every process left in
    it (forked workers outlive a killed parent); then reap it. A pid is not reused while
    it names a live process group, so the group signal reaches no stranger."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # not a group leader, or nothing of its group is left
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def stop(pid: int, timeout_s: float = 20.0) -> None:
    """SIGSTOP ``pid`` and return once the kernel shows it stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("T", "t"):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.005)


@contextmanager
def reaped() -> Iterator[list[subprocess.Popen[str]]]:
    """A list to put started processes in; every one still running at the end is
    killed (:func:`kill`) and all are reaped."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            kill(proc)
