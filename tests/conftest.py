"""Registers the shared fixtures (``tests/support``) for every test directory: the
backends (``sqlite_store``, ``pg``, ``backend``, ``store``, ``postgres_url``...), the
store clock, the worker factory, the private PostgreSQL cluster of the tests that
restart a server, the PgBouncers the run starts, the network namespaces of the partition
tests, and the rule that under ``CI`` a skip is a failure."""

from __future__ import annotations

# Modules that others import come first, so pytest loads (and rewrites) each before its user.
pytest_plugins = [
    "tests.support.ci",
    "tests.support.pgcluster",
    "tests.support.pgbouncer",
    "tests.support.backends",
    "tests.support.workers",
    "tests.support.netns",
]
