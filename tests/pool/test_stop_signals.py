"""Stop signals that land at awkward moments: in a child that is still starting. (The
token a handler cancels takes no lock: tests/model/test_cancellation.py.)"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.support import processes

from . import pool_app


@pytest.mark.timeout(90)
def test_sigterm_reaching_a_child_before_its_handlers_are_set_stops_it_at_once(
    sqlite_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is held inside ``os.fork()`` (an at-fork hook sleeps 2 s) when the pool
    is told to stop, so the SIGTERM the supervisor forwards reaches it before its own
    handlers exist. Run then, the parent's handler would cancel the parent's token as
    copied into the child, and the child would run on until the 30 s grace killed it;
    held until the child's handlers are in place, it stops the child as soon as it starts."""
    ledger = tmp_path / "ledger.txt"
    forked = Path(f"{ledger}.forked")
    monkeypatch.setenv("POOL_LEDGER", str(ledger))
    monkeypatch.setenv("POOL_CHILD_START_PAUSE_S", "2")
    with processes.reaped() as started:
        proc = pool_app.spawn(f"sqlite:///{sqlite_path}", lease_s=2.0, grace_s=30.0, concurrency=1)
        started.append(proc)
        deadline = time.monotonic() + 30
        while not (forked.exists() and forked.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert forked.exists(), "the child never started"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - signalled
    assert proc.returncode == 0
    assert json.loads(out)["restarts"] == 0
    assert took < 15, f"the pool took {took:.1f} s to stop: the child missed its SIGTERM"
