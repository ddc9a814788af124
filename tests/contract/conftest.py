"""The store contract suite runs on a third backend too: PostgreSQL through PgBouncer in
transaction mode (``tests/support/backends.py``), where nothing may outlive a
transaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.backends import CONTRACT_BACKENDS, Backend, open_backend


@pytest.fixture(params=CONTRACT_BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from open_backend(request, tmp_path)
