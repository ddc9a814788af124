"""The PgBouncer parameters of a PostgreSQL store URL: taken out before libpq sees the URL,
checked with errors that name the value, and never echoing a password."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from runifold_sync.errors import InvalidArgument
from runifold_sync.store.postgres.url import parse_target


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


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://",
        "postgres://",
        "postgresql://postgres@127.0.0.1:5432",
        "postgresql://u:SECRETPW@127.0.0.1:5432/",
        "postgresql://u:SECRETPW@bouncer:6432?pgbouncer=true",
        "host=127.0.0.1 port=5432 password=SECRETPW",
    ],
)
def test_a_url_naming_no_database_is_refused_naming_it(url: str) -> None:
    """libpq would pick the user's name, and opening would migrate that database."""
    with pytest.raises(InvalidArgument, match="names no database") as raised:
        parse_target(url)
    assert "SECRETPW" not in str(raised.value)
    assert url.replace("SECRETPW", "***") in str(raised.value)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql://u:SECRETPW@h/app?sslmode=bogus", "'bogus'"),
        ("postgresql://u:SECRETPW@h:99999/app", "'99999'"),
        ("postgresql://u:SECRETPW@h:abc/app", "'abc'"),
        ("postgresql://u:SECRETPW@h:0/app", "'0'"),
        ("postgresql://u:SECRETPW@h1:5432,h2:70000/app", "'70000'"),
        ("postgresql://u:SECRETPW@h/app?port=99999&pgbouncer=true", "'99999'"),
        ("host=h port=abc dbname=app password=SECRETPW", "'abc'"),
        ("postgresql://u:SECRETPW@h/app?nosuchoption=1", "nosuchoption"),
    ],
)
def test_connection_options_libpq_would_refuse_are_refused_before_connecting(url: str, named: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_target(url)
    assert named in str(raised.value)
    assert "SECRETPW" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db/app?sslmode=verify-full",
        "postgresql://u@h1:5432,h2:5433/app",
        "postgresql://u@h1,h2:5433/app",
        "postgresql://u@db?dbname=app",
        "postgresql://u@bouncer:6432/app?pgbouncer=true&listen_host=db&listen_port=5432",
    ],
)
def test_documented_forms_pass(url: str) -> None:
    assert parse_target(url).conninfo


@pytest.mark.parametrize("password", ["SECRET?PW", "SECRET#PW", "SE[CRET]PW", "SECRET@PW"])
def test_a_password_libpq_reads_whole_keeps_our_parameters_apart_and_is_never_shown(password: str) -> None:
    """libpq takes ?, #, [ and ] in a URL's password as they are; urlsplit took them for
    the query, the fragment or an IPv6 host, so pgbouncer=true reached libpq (refused as
    an unknown parameter) or a bracket raised a bare ValueError."""
    url = f"postgresql://app:{password}@db:6432/jobs?pgbouncer=true&listen_port=5432&sslmode=require"
    target = parse_target(url)
    assert target.conninfo == f"postgresql://app:{password}@db:6432/jobs?sslmode=require"
    assert target.pgbouncer and target.listen_conninfo is not None
    assert conninfo_to_dict(target.listen_conninfo)["port"] == "5432"
    assert "SECRET" not in repr(target)
