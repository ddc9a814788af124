"""Registers the shared fixtures (``tests/support``) for every test directory: the
backends (``sqlite_store``, ``pg``, ``backend``, ``store``, ``postgres_url``...), the
store clock, the worker factory, the private PostgreSQL cluster of the tests that
restart a server and the network namespaces of the partition tests."""

from __future__ import annotations

pytest_plugins = [
    "tests.support.backends",
    "tests.support.workers",
    "tests.support.pgcluster",
    "tests.support.netns",
]
