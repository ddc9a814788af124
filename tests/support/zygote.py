"""A pre-imported parent for the suite's subprocess apps: ``python -m tests.support.zygote
NAME`` listens on the abstract socket NAME, imports the package, psycopg and the CLI
once, then forks a child for each ``python -m module args`` a test asks for
(``tests/support/processes.py`` sends the request), instead of the test starting a new
interpreter that imports them all again.

A fresh interpreter spends 0.3-0.6 s of CPU before an app's first line (the package's
attrs classes, psycopg); the suite starts a few hundred, which made them the largest
single cost of a run on two cores. A forked child is as real a process as an exec'd one
(its own pid, session, descriptors and environment; SIGKILL and SIGSTOP reach it alone),
and it starts with no connection, pool or thread: this parent opens none and checks it
runs no thread before every fork.

What a child would otherwise have read from its environment at start is set again for
it: the environment itself, the working directory, ``sys.argv`` and ``sys.path[0]`` as
``-m`` sets them, the time zone and the armed crash points. ``processes`` sends only
requests whose ``PYTHON*`` and ``LD_*`` variables match this parent's (the interpreter
read those at its own start); others are exec'd as before.

Protocol, one ``SOCK_SEQPACKET`` connection per child: the request (JSON with the
child's stdin, stdout, stderr and passed descriptors attached), then ``{"pid": n}`` back,
then ``{"status": s}`` (a ``waitpid`` status) once the child has been reaped.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time

import attrs

PRELOAD = ("runifold_sync", "runifold_sync.cli.main", "runifold_sync.store.postgres.store", "psycopg_pool")
MAX_REQUEST = 1 << 20
MAX_FDS = 16
SAFE_FD_FLOOR = 256  # received descriptors are moved above the targets before dup2


@attrs.frozen
class Request:
    """One child to start: ``python -m module *args`` in ``cwd`` with ``env``; ``fds``
    become descriptors ``targets`` (0, 1, 2 and any passed ones) in the child."""

    module: str
    args: list[str]
    cwd: str
    env: dict[str, str]
    new_session: bool
    targets: list[int]
    fds: list[int]


def serve(listener: socket.socket) -> Request:
    """Fork a child per request and report each one's end to its requester, until this
    process's stdin closes (its test process is gone). Returns only in a forked child,
    with everything of the parent's closed."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)
    links: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj == 0 and not os.read(0, 4096):
                sys.exit(0)
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                reap(links)
            if key.fileobj is listener:
                link, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(link, MAX_REQUEST, MAX_FDS)
                assert threading.active_count() == 1, "a thread would cross the fork"
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for sock in (listener, link, *links.values()):
                        sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    return Request(**json.loads(message), fds=fds)
                for fd in fds:
                    os.close(fd)
                link.send(json.dumps({"pid": pid}).encode())
                links[pid] = link


def reap(links: dict[int, socket.socket]) -> None:
    """Send each ended child's wait status to its requester and close the link."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        link = links.pop(pid, None)
        if link is None:
            continue
        try:
            link.send(json.dumps({"status": status}).encode())
        except OSError:
            pass  # the requester is gone; nobody waits for this one
        link.close()


def become(request: Request) -> None:
    """Turn this forked child into ``python -m module args`` as the request describes,
    then run the module as ``__main__``; its end (return, ``SystemExit``, an uncaught
    exception) ends the process as it would an exec'd interpreter."""
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, SAFE_FD_FLOOR) for fd in request.fds]
    for fd in request.fds:
        os.close(fd)
    for fd, target in zip(moved, request.targets, strict=True):
        os.dup2(fd, target)
    keep = set(request.targets)
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the listing's own descriptor, already closed
    if request.new_session:
        os.setsid()
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    time.tzset()
    from runifold_sync.model import crashpoints

    crashpoints.read_environment()
    sys.path[0] = request.cwd
    sys.argv = ["-m", *request.args]
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> None:
    (name,) = argv
    for module in PRELOAD:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"\0{name}")  # an abstract socket: no file left behind
    listener.listen(64)
    os.write(1, b"ready\n")
    become(serve(listener))


if __name__ == "__main__":
    main(sys.argv[1:])
