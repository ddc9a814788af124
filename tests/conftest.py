"""Shared fixtures: a fresh SQLite database file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runifold_sync.sqlite import SqliteWorkflowStore


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "workflows.db"


@pytest.fixture
def sqlite_store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    store = SqliteWorkflowStore.open(sqlite_path)
    yield store
    store.close()
