"""Operators' logins (the dashboard's sessions), on every store: live from
``start_login`` until ``end_login`` or their lifetime of store time runs out, and the
same to every store opened on the database, so a logout or an expiry in one process
holds in all."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import WorkflowStore
from runifold_sync.errors import InvalidArgument
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend


def test_a_login_is_live_until_it_ends_for_every_store_on_the_database(
    store: WorkflowStore, backend: Backend
) -> None:
    other = backend.open()  # another process's store, on the same database
    first = store.start_login(timedelta(hours=4))
    second = store.start_login(timedelta(hours=4))
    assert first != second and len(first) >= 43  # 256 random bits, URL-safe
    assert store.login_live(first) and other.login_live(first) and other.login_live(second)
    other.end_login(first)
    assert not store.login_live(first) and not other.login_live(first)
    assert store.login_live(second)
    store.end_login(first)  # ending one that is not live changes nothing
    assert not store.login_live("never-started")


def test_a_login_expires_after_its_lifetime_of_store_time(store: WorkflowStore) -> None:
    login = store.start_login(timedelta(minutes=30))
    store.set_clock_offset(timedelta(minutes=29))
    assert store.login_live(login)
    store.set_clock_offset(timedelta(minutes=30, seconds=1))
    assert not store.login_live(login)
    store.start_login(timedelta(minutes=1))  # deletes the expired login's row
    store.set_clock_offset(timedelta(0))  # so with the clock set back, it stays ended
    assert not store.login_live(login)


@pytest.mark.parametrize("lifetime", [timedelta(0), timedelta(seconds=-1), 3600, None, timedelta(days=3651)])
def test_a_login_lifetime_must_be_a_positive_timedelta_a_store_keeps(
    store: WorkflowStore, lifetime: object
) -> None:
    with pytest.raises(InvalidArgument, match="login lifetime must be"):
        store.start_login(lifetime)  # type: ignore[arg-type]


def test_a_login_id_must_be_text(store: WorkflowStore) -> None:
    with pytest.raises(InvalidArgument, match="login id must be a string"):
        store.login_live(7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="login id must not contain a NUL"):
        store.end_login("a\x00b")
