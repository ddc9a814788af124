"""Unit fixtures: the contract suite's backends, for the in-process tests that also run
on PostgreSQL (a test that takes ``store`` runs once per backend)."""

from __future__ import annotations

from tests.contract.conftest import (  # noqa: F401  (fixtures, registered by import)
    Backend,
    backend,
    postgres_admin_url,
    postgres_url,
    store,
)

__all__ = ["Backend"]
