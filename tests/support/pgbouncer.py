"""The PgBouncers a test run starts for itself: one pooling transactions and one pooling
sessions, in front of the suite's PostgreSQL server (``RUNIFOLD_TEST_POSTGRES_URL``),
on free ports of 127.0.0.1, started by the first test of this process that goes through
one and stopped when the session ends. Each pytest-xdist worker starts its own, as it
makes its own private cluster (``pgcluster.py``), so no test run depends on a PgBouncer
someone else left running, and two runs on one machine never share one.

``RUNIFOLD_TEST_PGBOUNCER_URL`` (transaction pooling) and
``RUNIFOLD_TEST_PGBOUNCER_SESSION_URL`` (session pooling) name PgBouncers to use instead,
such as the two ``tools/pgbouncer_up`` starts on 6432 and 6433.

As root PgBouncer runs as ``postgres`` (it refuses to run as root). Its work directory,
``/tmp/runifold-test-pgbouncer-<pid>-*``, holds its settings, log and pid file; one whose
test process is gone (a run killed before its teardown) is cleaned up by the next start,
its PgBouncer stopped. Where the ``pgbouncer`` binary is missing the tests through it
skip, which fails them under ``CI`` (``tests/support/ci.py``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import attrs
import psycopg
import pytest

from .pgcluster import alive, free_port

MODES = ("transaction", "session")
DIRECTORY_PREFIX = "runifold-test-pgbouncer-"
START_TIMEOUT_S = 15.0
# Every pytest-xdist worker starts two, so each keeps few server connections, and drops
# an idle one after a few seconds: the tests pass through hundreds of databases, and
# connections kept to them would fill the server's 100.
SETTINGS = """[databases]
* = {server}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/users.txt
admin_users = postgres
pool_mode = {mode}
max_client_conn = 200
default_pool_size = 10
max_db_connections = 12
server_idle_timeout = 5
logfile = {directory}/{mode}.log
pidfile = {directory}/{mode}.pid
"""


class PgBouncerError(Exception):
    """No PgBouncer could be started here (the message says why)."""


@attrs.frozen
class StartedPgBouncer:
    mode: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


_started: dict[str, StartedPgBouncer] = {}
_directory: list[Path] = []  # this process's work directory, once made


def started_pgbouncer_url(mode: str, server_url: str) -> str:
    """The admin URL of this process's PgBouncer pooling in ``mode``, started in front of
    ``server_url``'s server on first use; skips when none can be started."""
    if mode not in _started:
        try:
            _started[mode] = _start(mode, server_url)
        except (PgBouncerError, OSError) as exc:
            pytest.skip(f"no PgBouncer ({mode} pooling) could be started: {exc}")
    return _started[mode].admin_url


def started() -> dict[str, StartedPgBouncer]:
    """The PgBouncers this process has started, by pooling mode."""
    return dict(_started)


def stop_started() -> None:
    """Stop the PgBouncers this process started and remove their directory."""
    for bouncer in _started.values():
        bouncer.process.terminate()
        try:
            bouncer.process.wait(10)
        except subprocess.TimeoutExpired:
            bouncer.process.kill()
            bouncer.process.wait()
    _started.clear()
    for directory in _directory:
        shutil.rmtree(directory, ignore_errors=True)
    _directory.clear()


def pytest_unconfigure() -> None:
    stop_started()


def _server_entry(server_url: str) -> str:
    """The ``[databases]`` line's connection to the server: its host and port, with the
    URL's user and password when it names them (PgBouncer trusts its own clients)."""
    parts = urlsplit(server_url)
    entry = f"host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}"
    if parts.password:
        entry += f" user={unquote(parts.username or 'postgres')} password={unquote(parts.password)}"
    return entry


def _work_directory(server_url: str) -> Path:
    if _directory:
        return _directory[0]
    _clean_leftovers()
    directory = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-"))
    users = {"postgres", "root", pwd.getpwuid(os.geteuid()).pw_name}
    users.add(unquote(urlsplit(server_url).username or "postgres"))
    (directory / "users.txt").write_text("".join(f'"{user}" ""\n' for user in sorted(users)))
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in (directory, directory / "users.txt"):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
    _directory.append(directory)
    return directory


def _start(mode: str, server_url: str) -> StartedPgBouncer:
    binary = shutil.which("pgbouncer")
    if binary is None:
        raise PgBouncerError("the pgbouncer binary is not on PATH (Debian package pgbouncer)")
    directory = _work_directory(server_url)
    ini = directory / f"{mode}.ini"
    as_postgres = ["-u", "postgres"] if os.geteuid() == 0 else []
    for _attempt in range(3):  # another process may take the free port first
        port = free_port(set())
        ini.write_text(
            SETTINGS.format(server=_server_entry(server_url), port=port, directory=directory, mode=mode)
        )
        process = subprocess.Popen(
            [binary, *as_postgres, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        bouncer = StartedPgBouncer(mode, port, process)
        if _answers(bouncer):
            return bouncer
        if process.poll() is None:
            process.kill()
        process.wait()
    log = directory / f"{mode}.log"
    tail = log.read_text(errors="replace")[-600:] if log.exists() else "(no log)"
    raise PgBouncerError(f"pgbouncer {ini} did not answer within {START_TIMEOUT_S:.0f} s: {tail}")


def _answers(bouncer: StartedPgBouncer) -> bool:
    """Whether ``bouncer`` answers a query before it exits or the start timeout."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and bouncer.process.poll() is None:
        try:
            with psycopg.connect(bouncer.admin_url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            time.sleep(0.1)
    return False


def _clean_leftovers() -> None:
    """Stop the PgBouncers of test processes that are gone, and remove their directories."""
    for directory in Path(tempfile.gettempdir()).glob(f"{DIRECTORY_PREFIX}*"):
        owner = directory.name.removeprefix(DIRECTORY_PREFIX).split("-")[0]
        if not owner.isdigit() or alive(int(owner)):
            continue
        for pidfile in directory.glob("*.pid"):
            pid = pidfile.read_text().strip()
            if pid.isdigit() and str(directory).encode() in _cmdline(int(pid)):
                os.kill(int(pid), signal.SIGTERM)
        shutil.rmtree(directory, ignore_errors=True)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
