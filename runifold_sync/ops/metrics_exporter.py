"""``python -m runifold_sync.ops.metrics_exporter``: the HTTP endpoint of a pool's metrics,
in a process of its own.

The supervisor forks its workers and nothing may cross a fork, not even a thread, so
the HTTP server cannot run in the supervisor's process: ``metrics_endpoint`` starts this
one beside the pool instead (exec'd, not forked). At each scrape it merges the workers'
multiprocess files and reads the store gauges over a connection of its own (the URL comes
in ``$RUNIFOLD_DATABASE_URL``, never on the command line where ``ps`` would show a
password). It prints one line once it listens, and exits on SIGTERM or when its parent
is gone. Ctrl-C reaches the whole process group; it ignores that and leaves the stop to
the parent, so metrics stay up while the pool drains.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from ..engine.logs import configure_logging
from ..model.cancellation import CancellationToken
from ..store.open import open_store
from .metrics import StoreCollector
from .metrics_endpoint import READY

_PARENT_CHECK_S = 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runifold_sync.ops.metrics_exporter")
    parser.add_argument("--directory", required=True, help="the workers' PROMETHEUS_MULTIPROC_DIR")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    parent = os.getppid()
    stop = CancellationToken()  # a handler's Event.set() can deadlock the wait it interrupts
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.cancel())
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=args.directory)  # type: ignore[no-untyped-call]  # untyped upstream
    store = open_store()
    try:
        registry.register(StoreCollector(store))
        try:
            server, thread = start_http_server(args.port, args.host, registry)
        except OSError as exc:
            sys.exit(f"cannot serve metrics at {args.host}:{args.port}: {exc}")
        print(READY, flush=True)
        while not stop.wait(_PARENT_CHECK_S) and os.getppid() == parent:
            pass
        server.shutdown()
        server.server_close()
        thread.join()
    finally:
        store.close()


if __name__ == "__main__":
    main()
