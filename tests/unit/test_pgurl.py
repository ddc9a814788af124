"""The PgBouncer parameters of a PostgreSQL store URL: taken out before libpq sees the URL,
checked with errors that name the value, and never echoing a password."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from runifold_sync import InvalidArgument
from runifold_sync.store.pgurl import parse_target


def test_a_plain_url_or_conninfo_goes_to_libpq_unchanged() -> None:
    for url in ("postgresql://u@db:5432/app?sslmode=require", "host=db port=5432 dbname=app"):
        target = parse_target(url)
        assert (target.conninfo, target.pgbouncer, target.listen_conninfo) == (url, False, None)


def test_pgbouncer_true_is_taken_out_and_idle_workers_poll_without_a_listen_connection() -> None:
    target = parse_target("postgresql://u:pw@bouncer:6432/app?pgbouncer=true&sslmode=prefer")
    assert target.conninfo == "postgresql://u:pw@bouncer:6432/app?sslmode=prefer"
    assert target.pgbouncer and target.polls and target.listen_conninfo is None


def test_listen_host_and_port_make_a_direct_connection_with_the_rest_of_the_url() -> None:
    target = parse_target("postgresql://u:pw@bouncer:6432/app?pgbouncer=true&listen_host=db&listen_port=5432")
    assert target.conninfo == "postgresql://u:pw@bouncer:6432/app"
    assert target.listen_conninfo is not None and not target.polls
    direct = conninfo_to_dict(target.listen_conninfo)
    assert (direct["host"], direct["port"], direct["user"], direct["dbname"]) == ("db", "5432", "u", "app")
    assert direct["password"] == "pw"


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("pgbouncer=maybe", "'maybe'"),
        ("pgbouncer=true&listen_port=http", "'http'"),
        ("pgbouncer=true&listen_port=70000", "70000"),
        ("listen_port=5432", "pgbouncer=true"),
    ],
)
def test_bad_parameters_are_refused_naming_the_value_without_the_password(query: str, named: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_target(f"postgresql://u:SECRETPW@bouncer:6432/app?{query}")
    assert named in str(raised.value)
    assert "SECRETPW" not in str(raised.value)
