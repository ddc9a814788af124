"""The database of a chaos run: a throwaway SQLite file or PostgreSQL database, and the
local PostgreSQL server the run restarts."""

from __future__ import annotations

import os
import pwd
import shutil
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

from runifold_sync import StoreUnavailable

T = TypeVar("T")
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def note(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


@attrs.define
class Database:
    kind: str
    url: str
    admin_url: str | None = None
    dbname: str | None = None

    @classmethod
    def create(cls, kind: str, workdir: Path, admin_url: str | None) -> Database:
        if kind == "sqlite":
            return cls(kind, f"sqlite:///{workdir / 'chaos.db'}")
        import psycopg

        admin = admin_url or os.environ.get("RUNIFOLD_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
        dbname = f"runifold_chaos_{uuid.uuid4().hex[:12]}"
        retry(lambda: _admin(psycopg, admin, f'CREATE DATABASE "{dbname}"'))
        return cls(kind, urlsplit(admin)._replace(path=f"/{dbname}").geturl(), admin, dbname)

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
        if self.admin_url is None:
            return
        import psycopg

        sql = f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'
        retry(lambda: _admin(psycopg, self.admin_url, sql))


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
