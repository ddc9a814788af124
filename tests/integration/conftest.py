"""Integration fixtures: the contract suite's backends (a SQLite file, or a fresh
PostgreSQL database per test that is dropped afterwards), reused rather than duplicated.
Tests that take ``backend`` run once per backend."""

from __future__ import annotations

from tests.contract.conftest import (  # noqa: F401  (fixtures, registered by import)
    Backend,
    backend,
    postgres_admin_url,
    postgres_url,
)

__all__ = ["Backend"]
