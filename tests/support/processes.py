"""The harness for subprocess apps (``python -m tests.<dir>.<name>_app`` and the CLI):
start one from the repository root, wait for what it writes, stop or kill it, and reap
whatever a test leaves running.

:func:`spawn` and :func:`run` have the child forked by this process's pre-imported parent
(``tests/support/zygote.py``, started on first use) rather than exec'd, which spares
each child the interpreter's start and the package's imports. The child is an ordinary
``subprocess.Popen`` to the caller. Environments whose ``PYTHON*`` or ``LD_*`` variables
differ from the parent's (a preloaded fake clock, another ``PYTHONPATH``) need an
interpreter of their own and are exec'd."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

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
    return popen_class(env)(
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
    module: str, *args: str, timeout_s: float, env: Mapping[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` in ``cwd`` (the repository root unless told) to its
    end, output captured."""
    with popen_class(env)(
        command(module, *args),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Zygote:
    """This process's pre-imported parent: a ``tests.support.zygote`` server on an
    abstract socket (no file to clean up), ended by its stdin closing, which happens
    when this process exits however it exits."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        name = f"runifold-zygote-{self.owner}-{uuid.uuid4().hex}"
        self.path = f"\0{name}"
        self.process = subprocess.Popen(
            command("tests.support.zygote", name),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        if ready != b"ready\n":
            self.close()
            raise RuntimeError(
                f"the zygote did not start (it said {ready!r}, exit status {self.process.poll()})"
            )
        self.interpreter_env = interpreter_variables(os.environ)
        atexit.register(self.close)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()

    def fork(self, fields: dict[str, Any], fds: list[int]) -> tuple[int, socket.socket]:
        """Ask for a child; its pid, and the link its wait status will arrive on."""
        link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        link.connect(self.path)
        socket.send_fds(link, [json.dumps(fields).encode()], fds)
        reply = link.recv(4096)
        if not reply:
            link.close()
            raise RuntimeError(
                f"the zygote (pid {self.process.pid}) ended without starting {fields['module']}"
            )
        return json.loads(reply)["pid"], link


_zygote: Zygote | None = None


def zygote() -> Zygote:
    """This process's zygote, started on first use (and again in a forked child: a
    parent's socket and process are not this one's to use)."""
    global _zygote
    if _zygote is None or _zygote.owner != os.getpid():
        _zygote = Zygote()
    return _zygote


def interpreter_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables an interpreter reads only as it starts."""
    return {key: value for key, value in env.items() if key.startswith(("PYTHON", "LD_"))}


def popen_class(env: Mapping[str, str] | None) -> type[subprocess.Popen[str]]:
    """``ForkedPopen`` unless ``env`` needs an interpreter started with it."""
    wanted = interpreter_variables(os.environ if env is None else env)
    return ForkedPopen if wanted == zygote().interpreter_env else subprocess.Popen


class ForkedPopen(subprocess.Popen[str]):
    """A ``Popen`` of ``python -m module args`` whose child the zygote forks. The child
    is the zygote's, so waiting for it reads the status the zygote reports instead of
    calling ``waitpid``; everything else (pipes, signals, timeouts) is ``Popen``'s own."""

    _link: socket.socket

    def _execute_child(  # type: ignore[override]
        self, args: list[str], executable: object, preexec_fn: object, close_fds: bool,
        pass_fds: tuple[int, ...], cwd: str, env: Mapping[str, str] | None, startupinfo: object,
        creationflags: int, shell: bool, p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int,
        errread: int, errwrite: int, restore_signals: bool, gid: object, gids: object, uid: object,
        umask: int, start_new_session: bool, process_group: object,
    ) -> None:  # fmt: skip
        assert args[:2] == [sys.executable, "-m"], args
        fields = {
            "module": args[2],
            "args": args[3:],
            "cwd": os.fspath(cwd),
            "env": dict(os.environ if env is None else env),
            "new_session": start_new_session,
            "targets": [0, 1, 2, *pass_fds],
        }
        inherited = [p2cread, c2pwrite, errwrite]
        fds = [fd if fd != -1 else standard for standard, fd in enumerate(inherited)]
        self.pid, self._link = zygote().fork(fields, [*fds, *pass_fds])
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _reported(self, pid: int, flags: int) -> tuple[int, int]:
        """``waitpid`` for the zygote's child: (pid, status) once reported, else (0, 0)."""
        self._link.setblocking(not flags & os.WNOHANG)
        try:
            reply = self._link.recv(4096)
        except BlockingIOError:
            return 0, 0
        if not reply:
            raise ChildProcessError(f"the zygote ended without reporting pid {pid}")
        self._link.close()
        return pid, json.loads(reply)["status"]

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        return self._reported(self.pid, wait_flags)

    def _internal_poll(self, _deadstate: int | None = None, **_: object) -> int | None:
        return super()._internal_poll(_deadstate, _waitpid=self._reported)  # type: ignore[misc]


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
