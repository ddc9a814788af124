"""``python -m runifold_sync.pool.retention_process``: a pool's retention (``run --retention``)
in a process of its own.

The supervisor forks its workers and holds no store connection, so nothing crosses a
fork; pruning from its process would need one. Pruning in a worker slot would take that
slot from the pool's work. So :func:`pruning_beside` starts this process beside the pool
(exec'd, not forked), as ``metrics_endpoint`` starts the metrics exporter: it opens its
own store (the URL comes in ``$RUNIFOLD_DATABASE_URL``, never on the command line where
``ps`` would show a password) and runs ``retention.keep_pruning`` until SIGTERM or until
its parent is gone. Ctrl-C reaches the whole process group; it ignores that and leaves
the stop to the parent. The pool starts it again when it dies (``sidecar.KeptProcess``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from ..engine.logs import LogFormat, configure_logging
from ..errors import StoreUnavailable
from ..model.cancellation import CancellationToken
from ..store.base import WorkflowStore
from ..store.open import ENV_VAR, open_store
from ..store.outage import is_outage
from . import sidecar
from .retention import RetentionPolicy, keep_pruning

log = logging.getLogger("runifold_sync.pool.retention")

_PARENT_CHECK_S = 1.0
_SAY_EVERY_S = 60.0


@contextmanager
def pruning_beside(
    database_url: str, policy: RetentionPolicy, *, log_level: str = "info", log_format: LogFormat = "text"
) -> Iterator[sidecar.KeptProcess]:
    """Prune the store at ``database_url`` by ``policy`` from a process of its own while
    the block runs (a pool's ``run``); stopped, after its batch in hand, when it ends.
    The process is started again when it dies (a SIGKILL, the OOM killer) once the pool
    calls the yielded process's ``tend`` (``run_pool(tend=...)`` does on each pass of the
    supervisor's loop), so a pool does not go on without retention."""
    command = [sys.executable, "-m", "runifold_sync.pool.retention_process"]
    command += ["--older-than-s", repr(policy.older_than.total_seconds()), "--batch", str(policy.batch)]
    command += ["--share", repr(policy.share), "--every-s", repr(policy.every.total_seconds())]
    command += ["--log-level", log_level, "--log-format", log_format]
    pruner = sidecar.KeptProcess("retention process", command, {**os.environ, ENV_VAR: database_url}, log)
    log.info("pruning tasks finished more than %s ago (process %d)", policy.older_than, pruner.pid)
    try:
        yield pruner
    finally:
        pruner.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runifold_sync.pool.retention_process")
    parser.add_argument("--older-than-s", type=float, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--share", type=float, required=True)
    parser.add_argument("--every-s", type=float, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    policy = RetentionPolicy(
        timedelta(seconds=args.older_than_s), args.batch, args.share, timedelta(seconds=args.every_s)
    )
    token = CancellationToken()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda _s, _f: token.cancel())
    parent = os.getppid()

    def watch_parent() -> None:  # a parent killed with SIGKILL sends no SIGTERM
        while not token.wait(_PARENT_CHECK_S):
            if os.getppid() != parent:
                token.cancel()

    threading.Thread(target=watch_parent, name="runifold-retention-parent", daemon=True).start()
    store = _opened(policy, token)
    if store is None:
        return
    said = _Tally()
    try:
        pruned = keep_pruning(store, policy, token, on_batch=said.add)
    finally:
        store.close()
    log.info("retention stopped; %d tasks pruned", pruned)


def _opened(policy: RetentionPolicy, token: CancellationToken) -> WorkflowStore | None:
    """The store, once it answers (the pool waits out an outage at start, and so does
    its retention); None when stopped first."""
    while True:
        try:
            return open_store()
        except StoreUnavailable as exc:
            if not is_outage(exc):
                raise
            log.warning("retention cannot open the store yet, retrying: %s", exc)
        if token.wait(policy.every.total_seconds()):
            return None


class _Tally:
    """Says how many tasks were pruned at most once a minute, not once a batch."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.pruned = 0

    def add(self, deleted: int) -> None:
        self.pruned += deleted
        if self.pruned and time.monotonic() - self.since >= _SAY_EVERY_S:
            log.info(
                "pruned %d finished tasks in the last %.0f s", self.pruned, time.monotonic() - self.since
            )
            self.since, self.pruned = time.monotonic(), 0


if __name__ == "__main__":
    main()
