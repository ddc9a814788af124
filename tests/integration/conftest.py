"""Integration fixtures: the contract suite's backends (a SQLite file, or a fresh
PostgreSQL database per test that is dropped afterwards), reused rather than duplicated.
Tests that take ``backend`` run once per backend."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.contract.conftest import (  # noqa: F401  (fixtures, registered by import)
    Backend,
    backend,
    postgres_admin_url,
    postgres_url,
)

__all__ = ["Backend", "fail_in_ci_when_not_restartable"]


def fail_in_ci_when_not_restartable(admin_url: str) -> None:
    """Under ``CI``, fail a test that needs to restart the PostgreSQL server when this
    process cannot: a restart test that quietly skips (or runs with no restart) would
    leave surviving a restart unproven. Outside CI the caller skips or goes on without."""
    if os.environ.get("CI"):
        parts = urlsplit(admin_url)
        pytest.fail(
            f"PostgreSQL at {parts.hostname}:{parts.port or 5432} cannot be restarted by this process: "
            "it must be a local cluster listed by pg_lsclusters, with pg_ctlcluster on PATH, and this "
            "process root or the cluster's owner. CI is set, so the restart must be tested, not skipped"
        )
