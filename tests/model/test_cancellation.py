"""``CancellationToken``: set from another thread or from a signal handler."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from runifold_sync.model.cancellation import WAKE_SLICE_S, CancellationToken

# A SIGALRM every 300 us, each handler cancelling the token, while the main thread does
# nothing but wait on it: every handler interrupts a wait somewhere inside. A token whose
# cancel takes the lock its wait holds deadlocks here within a second (the handler blocks
# on the lock of the thread it interrupted).
_HANDLER_INSIDE_WAIT = """
import signal, time
from runifold_sync.model.cancellation import WAKE_SLICE_S, CancellationToken
token = CancellationToken()
signal.signal(signal.SIGALRM, lambda _s, _f: token.cancel())
signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
end = time.monotonic() + 1.5
waits = 0
while time.monotonic() < end:
    token.wait(0.0)
    waits += 1
signal.setitimer(signal.ITIMER_REAL, 0)
print(waits)
"""


def test_a_signal_handler_cancelling_the_token_inside_its_wait_never_deadlocks() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HANDLER_INSIDE_WAIT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def test_wait_returns_false_after_its_timeout_when_nobody_cancels() -> None:
    token = CancellationToken()
    started = time.monotonic()
    assert token.wait(0.1) is False
    assert time.monotonic() - started >= 0.1
    assert not token.cancelled


def test_a_cancel_from_another_thread_ends_a_long_wait_within_one_slice() -> None:
    token = CancellationToken()
    threading.Timer(0.2, token.cancel).start()
    started = time.monotonic()
    assert token.wait(30) is True
    assert time.monotonic() - started < 0.2 + WAKE_SLICE_S + 1.0
    assert token.cancelled and token.wait(5) is True
