"""A PostgreSQL cluster of its own for the tests that restart or stop their server.

The shared server (``RUNIFOLD_TEST_POSTGRES_URL``, port 5432 by default) carries every
other PostgreSQL test, often of several test runs at once: a test that restarted it
would fail all of them ("the database system is shutting down"). So such a test takes
``private_postgres``: a cluster made with ``pg_createcluster`` on a free port for this
test process (each pytest-xdist worker that needs one makes its own), trusting local
connections, started with ``pg_ctlcluster`` and dropped at the end of the session. The
test restarts that cluster alone.

Cluster names start with ``PREFIX`` and carry the creating process's pid: a cluster
whose process is gone (a run killed before its teardown) is dropped by the next run.
Where no cluster can be made (no ``pg_createcluster``, or not root or ``postgres``) the
tests that need one skip, which fails them under ``CI`` (``tests/support/ci.py``): a
restart left untested is a hole.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import psycopg
import pytest

PREFIX = "runifold_test_"
LOCK = Path("/tmp/runifold-test-pgcluster.lock")  # pg_createcluster runs one at a time
TRUST_ALL = "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
TOOLS = ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster", "pg_lsclusters")


class ClusterError(Exception):
    """A pg_* cluster command failed, or no private cluster can be made here (the message says why)."""


@attrs.frozen
class PrivateCluster:
    """A cluster this test process created, owns and may restart."""

    version: str
    name: str
    port: int

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, action: str) -> None:
        """``pg_ctlcluster <action>`` (start, stop, restart); raises when it fails."""
        _run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action, timeout=120)

    def crash(self) -> None:
        """Stop the server in immediate mode, as a crash does: no shutdown checkpoint,
        and the log not yet flushed to disk is lost."""
        _run(
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            "-m",
            "immediate",
            self.version,
            self.name,
            "stop",
            timeout=120,
        )

    def online(self) -> bool:
        return any(c[:3] == (self.version, self.name, self.port) and c[3] for c in _listed())

    def wait_until_reachable(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg.connect(self.admin_url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def ensure_running(self) -> None:
        """Leave the cluster up and answering, whatever a test did to it."""
        if not self.online():
            self.ctl("start")
        self.wait_until_reachable()

    def drop(self) -> None:
        _run("pg_dropcluster", "--stop", self.version, self.name, timeout=120)


@attrs.frozen
class ClusterAttempt:
    """The session's private cluster, or why there is none."""

    cluster: PrivateCluster | None
    why_not: str = ""


def _run(*args: str, timeout: float) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _listed() -> list[tuple[str, str, int, bool]]:
    """(version, name, port, online) of every cluster ``pg_lsclusters`` knows."""
    listed = []
    for line in _run("pg_lsclusters", "--no-header", timeout=30).splitlines():
        version, name, port, status, *_ = line.split()
        listed.append((version, name, int(port), status.startswith("online")))
    return listed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_leftovers() -> None:
    """Drop the private clusters of test processes that are gone."""
    for version, name, _port, _online in _listed():
        if not name.startswith(PREFIX):
            continue
        pid = name.removeprefix(PREFIX).split("_")[0]
        if pid.isdigit() and not alive(int(pid)):
            _run("pg_dropcluster", "--stop", version, name, timeout=120)


def free_port(taken: set[int]) -> int:
    """A port nothing listens on and no cluster is configured for."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port not in taken:
            return port


def create_cluster() -> PrivateCluster:
    """Make, configure and start a cluster on a free port; raises ``ClusterError``."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not on PATH (install postgresql-common)")
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        raise ClusterError("pg_createcluster needs root or the postgres user")
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])
    if not versions:
        raise ClusterError("no PostgreSQL version under /etc/postgresql")
    version = versions[-1]
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        drop_leftovers()
        port = free_port({listed[2] for listed in _listed()})
        cluster = PrivateCluster(version, f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}", port)
        # A throwaway cluster: initdb need not fsync what no machine crash will test.
        _run("pg_createcluster", version, cluster.name, "-p", str(port), "--", "--no-sync", timeout=300)
    try:
        Path(f"/etc/postgresql/{version}/{cluster.name}/pg_hba.conf").write_text(TRUST_ALL)
        cluster.ctl("start")
        cluster.wait_until_reachable()
    except BaseException:
        cluster.drop()
        raise
    return cluster


@pytest.fixture(scope="session")
def private_postgres_attempt() -> Iterator[ClusterAttempt]:
    """This process's private cluster, made on first use and dropped at the end of the
    session; under ``CI`` a cluster that cannot be made fails the test (a test that
    falls back to the shared server without one would not say so)."""
    try:
        cluster = create_cluster()
    except (ClusterError, OSError, subprocess.TimeoutExpired, psycopg.Error) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no private PostgreSQL cluster: {exc}; CI is set, so the restart must be tested")
        yield ClusterAttempt(None, f"no private PostgreSQL cluster: {exc}")
        return
    try:
        yield ClusterAttempt(cluster)
    finally:
        cluster.drop()


@pytest.fixture(scope="session")
def private_postgres(private_postgres_attempt: ClusterAttempt) -> PrivateCluster:
    """A cluster for a test that restarts or stops its server; skips when none can be
    made here."""
    if private_postgres_attempt.cluster is None:
        pytest.skip(private_postgres_attempt.why_not)
    return private_postgres_attempt.cluster
