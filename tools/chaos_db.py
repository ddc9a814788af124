"""The database of a chaos run: a throwaway SQLite file or PostgreSQL database, the local
PostgreSQL server the run restarts, and the clusters a scenario makes for itself.

A scenario that fills the server's connection slots, restarts it or fails it over
(``chaos_scenarios.py``) runs on clusters of its own, never on a server others use: one
cluster, or a primary with a synchronous streaming standby, made with the Debian
cluster tools (``pg_createcluster``, ``pg_basebackup``) on free ports, trusting local
connections, and dropped at the end. Their names carry the tool's pid, so a run killed
before its teardown has its clusters dropped by the next one. Making them needs root or
the ``postgres`` user.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs

from runifold_sync.errors import StoreUnavailable

T = TypeVar("T")
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CLUSTER_PREFIX = "runifold_chaos_"
CLUSTER_LOCK = Path("/tmp/runifold-test-pgcluster.lock")  # the tests' lock: one pg_createcluster at a time
STANDBY_NAME = "runifold_standby"  # the standby's application_name, which the primary waits for
TRUST = (
    "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
    "host replication all 127.0.0.1/32 trust\n"
)
# A scenario's server: few connection slots, so filling them is quick (the pool of a
# chaos run and the tool's own threads take about 30), and no fsync: its faults kill
# processes and servers, never the machine, whose page cache keeps what was written (a
# synchronous standby still confirms each commit before it returns).
SETTINGS = "max_connections = 60\nmax_wal_senders = 4\nfsync = off\n"


def note(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


def database_prefix() -> str:
    """``RUNIFOLD_TEST_DB_PREFIX`` when set (a shared server's naming rule), else the tool's."""
    from runifold_sync.testing.plugin import database_prefix as prefix

    return prefix("runifold_chaos_")


@attrs.define
class Database:
    """The run's database. ``url`` is the store's (on a failover pair, both hosts with
    ``target_session_attrs=read-write``), ``admin_url`` the server's (its primary's)."""

    kind: str
    url: str
    admin_url: str | None = None
    dbname: str | None = None
    clusters: list[Cluster] = attrs.Factory(list)  # made for this run, dropped with it

    @classmethod
    def create(cls, kind: str, workdir: Path, admin_url: str | None, own_clusters: int = 0) -> Database:
        """A fresh database: a SQLite file in ``workdir``, or a PostgreSQL database on
        ``admin_url``'s server, or with ``own_clusters`` on a cluster made for the run
        (1), or on a primary with a synchronous standby (2)."""
        if kind == "sqlite":
            return cls(kind, f"sqlite:///{workdir / 'chaos.db'}")
        import psycopg

        clusters = make_clusters(own_clusters)
        if clusters:
            admin_url = clusters[0].admin_url
        admin = admin_url or os.environ.get("RUNIFOLD_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
        dbname = f"{database_prefix()}{uuid.uuid4().hex[:12]}"
        retry(lambda: _admin(psycopg, admin, f'CREATE DATABASE "{dbname}"'))
        url = urlsplit(admin)._replace(path=f"/{dbname}").geturl()
        if len(clusters) == 2:
            hosts = ",".join(f"127.0.0.1:{cluster.port}" for cluster in clusters)
            url = f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"
        return cls(kind, url, admin, dbname, clusters)

    def integrity(self) -> str | None:
        if self.kind != "sqlite":
            return None
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
        finally:
            conn.close()
        return "; ".join(str(r[0]) for r in rows)

    def drop(self) -> None:
        if self.clusters:
            for cluster in self.clusters:
                cluster.drop()
            return
        if self.admin_url is None:
            return
        import psycopg

        sql = f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'
        retry(lambda: _admin(psycopg, self.admin_url, sql))

    def primary_admin_url(self) -> str:
        """The admin URL of the server that takes writes now (after a failover, the
        promoted standby's)."""
        assert self.admin_url is not None
        for cluster in self.clusters:
            if cluster.online() and not cluster.in_recovery():
                return cluster.admin_url
        return self.admin_url


def _admin(psycopg: Any, url: str | None, sql: str) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


def _transient() -> tuple[type[Exception], ...]:
    """Errors that mean the database is away for now (a server restart)."""
    try:
        import psycopg
    except ImportError:
        return (StoreUnavailable, OSError)
    return (StoreUnavailable, OSError, psycopg.OperationalError)


def retry(action: Callable[[], T], attempts: int = 60) -> T:
    """Run ``action``, retrying while the database is away."""
    for attempt in range(attempts):
        try:
            return action()
        except _transient() as exc:
            if attempt == attempts - 1:
                raise
            note(f"retrying after {type(exc).__name__}: {exc}".splitlines()[0])
            time.sleep(0.5)
    raise AssertionError("unreachable")


class PostgresServer:
    """The local cluster behind a URL, restarted with ``pg_ctlcluster``; ``cluster`` is
    None unless it runs on this host and this process may control it (root or its owner)."""

    def __init__(self, url: str) -> None:
        self.cluster: tuple[str, str] | None = None
        port = urlsplit(url).port or 5432
        if urlsplit(url).hostname not in (None, "", "127.0.0.1", "localhost", "::1"):
            return
        if shutil.which("pg_lsclusters") is None or shutil.which("pg_ctlcluster") is None:
            return
        out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            version, name, cluster_port, _status, owner, *_ = line.split()
            if int(cluster_port) == port and os.geteuid() in (0, pwd.getpwnam(owner).pw_uid):
                self.cluster = (version, name)

    def _ctl(self, action: str) -> subprocess.CompletedProcess[str]:
        assert self.cluster is not None
        version, name = self.cluster
        return subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def restart(self) -> bool:
        """Restart the server (a fast shutdown: every connection is cut); always leaves
        it running, even when someone else restarts it at the same moment."""
        if self.cluster is None:
            return False
        done = self._ctl("restart").returncode == 0
        self.ensure_running()
        return done

    def ensure_running(self) -> None:
        if self.cluster is None:
            return
        for _ in range(60):
            if self._ctl("status").returncode == 0:
                return
            self._ctl("start")
            time.sleep(1)


class ClusterError(Exception):
    """A cluster command failed, or no cluster can be made here (the message says why)."""


def _run(*args: str, timeout_s: float = 120) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return done.stdout


@attrs.frozen
class Cluster:
    """A cluster this run made, owns, and may stop, kill, promote and drop."""

    version: str
    name: str
    port: int

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def config(self) -> Path:
        return Path(f"/etc/postgresql/{self.version}/{self.name}")

    @property
    def data(self) -> Path:
        return Path(f"/var/lib/postgresql/{self.version}/{self.name}")

    def ctl(self, action: str) -> None:
        _run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action)

    def online(self) -> bool:
        try:
            import psycopg

            psycopg.connect(self.admin_url, connect_timeout=2).close()
            return True
        except Exception:
            return False

    def in_recovery(self) -> bool:
        import psycopg

        with psycopg.connect(self.admin_url, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def wait_until(self, ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"cluster {self.name} on port {self.port}: {what} within {timeout_s:.0f} s"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a machine that dies: no shutdown, no checkpoint.
        Its backends notice their parent's death and exit; nothing restarts it."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        """Make this standby the primary, and wait until it takes writes."""
        self.ctl("promote")
        self.wait_until(lambda: self.online() and not self.in_recovery(), "promoted and taking writes")

    def drop(self) -> None:
        try:
            _run("pg_dropcluster", "--stop", self.version, self.name)
        except ClusterError as exc:
            note(f"dropping cluster {self.name}: {exc}")


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port not in taken:
            return port


def _clusters_listed() -> list[tuple[str, str, int | None]]:
    """(version, name, port) of every cluster ``pg_lsclusters`` knows. The port is None
    for a cluster whose configuration names none yet, as another process's cluster does
    while ``pg_createcluster`` is writing it (listed as ``<unknown>``)."""
    listed: list[tuple[str, str, int | None]] = []
    for line in _run("pg_lsclusters", "--no-header").splitlines():
        version, name, port = line.split()[:3]
        listed.append((version, name, int(port) if port.isdigit() else None))
    return listed


def _drop_leftovers() -> None:
    """Drop the clusters of chaos runs whose process is gone."""
    for version, name, _port in _clusters_listed():
        pid = name.removeprefix(CLUSTER_PREFIX).split("_")[0]
        if name.startswith(CLUSTER_PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            Cluster(version, name, 0).drop()


def _new_cluster(role: str, settings: str) -> Cluster:
    """Create (not start) a cluster for ``role`` on a free port, with ``settings``
    added to its configuration and local connections trusted."""
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])
    with open(CLUSTER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _drop_leftovers()
        port = _free_port({listed[2] for listed in _clusters_listed() if listed[2] is not None})
        name = f"{CLUSTER_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:6]}_{role}"
        cluster = Cluster(versions[-1], name, port)
        _run("pg_createcluster", cluster.version, name, "-p", str(port), "--", "--no-sync", timeout_s=300)
    (cluster.config / "pg_hba.conf").write_text(TRUST)
    (cluster.config / "conf.d" / "runifold_chaos.conf").write_text(SETTINGS + settings)
    return cluster


def _can_make_clusters() -> None:
    missing = [t for t in ("pg_createcluster", "pg_ctlcluster", "pg_basebackup") if not shutil.which(t)]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not on PATH (Debian package postgresql-common)")
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        raise ClusterError("making a cluster needs root or the postgres user")


def make_clusters(count: int) -> list[Cluster]:
    """No cluster (0), one cluster (1), or a primary and its synchronous streaming
    standby (2), started; raises ``ClusterError``."""
    if count == 0:
        return []
    _can_make_clusters()
    sync = f"synchronous_standby_names = '{STANDBY_NAME}'\n" if count == 2 else ""
    primary = _new_cluster("primary", sync)
    made = [primary]
    try:
        primary.ctl("start")
        primary.wait_until(primary.online, "answering")
        if count == 2:
            made.append(_standby_of(primary))
    except BaseException:
        for cluster in made:
            cluster.drop()
        raise
    return made


def _standby_of(primary: Cluster) -> Cluster:
    """A streaming standby of ``primary``, copied with ``pg_basebackup``, named as the
    primary's ``synchronous_standby_names`` expects, and caught up."""
    standby = _new_cluster("standby", "")
    try:
        for path in standby.data.iterdir():  # pg_basebackup fills an empty directory
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={STANDBY_NAME}"
        as_postgres = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
        copy = ["pg_basebackup", "-d", conninfo, "-D", str(standby.data), "-X", "stream", "-R", "--no-sync"]
        _run(*as_postgres, *copy)
        with open(standby.data / "postgresql.auto.conf", "a") as auto:
            auto.write(f"primary_conninfo = '{conninfo}'\n")
        standby.ctl("start")
        standby.wait_until(standby.online, "answering")
    except BaseException:
        standby.drop()
        raise

    def streaming_in_sync() -> bool:
        import psycopg

        with psycopg.connect(primary.admin_url, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT 1 FROM pg_stat_replication WHERE application_name = %s AND sync_state = 'sync'",
                (STANDBY_NAME,),
            ).fetchall()
        return bool(rows)

    primary.wait_until(streaming_in_sync, "streaming to its synchronous standby")
    return standby
