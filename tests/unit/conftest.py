"""Unit fixtures: the in-process worker tests move the clock of ``sqlite_store`` (tests
that take ``store`` run once per backend, with the fixtures of ``tests/support``)."""

from __future__ import annotations

import pytest

from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.clock import Clock


@pytest.fixture
def clock(sqlite_store: SqliteWorkflowStore) -> Clock:
    return Clock(sqlite_store)
