"""The test run's own PgBouncers (``tests/support/pgbouncer.py``): with no
``RUNIFOLD_TEST_PGBOUNCER_URL`` or ``_SESSION_URL`` set, the first test of a process
that goes through PgBouncer starts one per pooling mode, on a free port of 127.0.0.1,
in front of the suite's server; a test's database is reachable through each; a
variable that names a PgBouncer is used instead."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest

from tests.support import pgbouncer
from tests.support.backends import pgbouncer_admin_url, through_pgbouncer

VARIABLES = ("RUNIFOLD_TEST_PGBOUNCER_URL", "RUNIFOLD_TEST_PGBOUNCER_SESSION_URL")


def _config(admin_url: str) -> dict[str, str]:
    """PgBouncer's own settings, from its admin console (simple queries only)."""
    console = urlsplit(admin_url)._replace(path="/pgbouncer").geturl()
    with psycopg.connect(console, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        return {row[0]: str(row[1]) for row in conn.execute("SHOW CONFIG").fetchall()}


@pytest.mark.parametrize("mode", pgbouncer.MODES)
def test_the_run_starts_its_own_pgbouncer_in_each_pooling_mode(
    mode: str, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    url = pgbouncer_admin_url(mode)
    bouncer = pgbouncer.started()[mode]
    assert url == bouncer.admin_url and bouncer.process.poll() is None
    config = _config(url)
    assert (config["pool_mode"], config["listen_addr"], config["listen_port"]) == (
        mode,
        "127.0.0.1",
        str(bouncer.port),
    )
    assert config["server_idle_timeout"] == "5"
    # The test's own database, through it (transaction mode: LISTEN goes to the server).
    pooled = through_pgbouncer(postgres_url, mode).split("?")[0]
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
        row = conn.execute("SELECT current_database(), inet_server_port()").fetchone()
    assert row == (urlsplit(postgres_url).path.lstrip("/"), urlsplit(postgres_url).port or 5432)


def test_a_pgbouncer_the_variable_names_is_used_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    elsewhere = pgbouncer_admin_url("session")  # stands for one someone else runs
    monkeypatch.setenv("RUNIFOLD_TEST_PGBOUNCER_URL", elsewhere)
    assert pgbouncer_admin_url("transaction") == elsewhere
