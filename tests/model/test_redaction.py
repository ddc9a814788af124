"""Connection strings are printed with their passwords masked, in both forms a store
accepts, and a driver message that quotes a password is scrubbed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import Settings, WorkerId, WorkflowRegistry, WorkflowWorker, open_store
from runifold_sync.cli.main import main
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.redaction import redacted, scrubbed
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.postgres.pool import describe


@pytest.mark.parametrize(
    ("connection", "shown"),
    [
        ("postgresql://app:SECRETPW@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        ("postgres://app:p%40ss@db/jobs?sslmode=require", "postgres://app:***@db/jobs?sslmode=require"),
        (
            "postgresql://db/jobs?password=SECRETPW&sslmode=require",
            "postgresql://db/jobs?password=***&sslmode=require",
        ),
        ("postgresql://db/jobs?sslpassword=SECRETPW", "postgresql://db/jobs?sslpassword=***"),
        ("host=db password=SECRETPW dbname=jobs", "host=db password=*** dbname=jobs"),
        ("host=db password = 'SECRET PW' dbname=jobs", "host=db password = *** dbname=jobs"),
        ("host=db PASSWORD='it\\'s' dbname=jobs", "host=db PASSWORD=*** dbname=jobs"),
        ("postgresql://app@db/jobs", "postgresql://app@db/jobs"),
        ("sqlite:///runifold-workflows.db", "sqlite:///runifold-workflows.db"),
        ("host=db dbname=jobs", "host=db dbname=jobs"),
        # libpq takes ?, #, [ and ] in a URL's password as they are (urlsplit cut there)
        ("postgresql://app:SECRET?PW@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        (
            "postgresql://app:SECRET#PW@db/jobs?pgbouncer=true",
            "postgresql://app:***@db/jobs?pgbouncer=true",
        ),
        ("postgresql://app:SE[CRET]PW@db/jobs", "postgresql://app:***@db/jobs"),
        ("postgresql://app:SECRET@PW@db/jobs", "postgresql://app:***@db/jobs"),  # both readings
        ("sqlite://app:SECRETPW@host/x.db", "sqlite://app:***@host/x.db"),
        ("sqlite:///x.db?password=SECRETPW", "sqlite:///x.db?password=***"),
        # key=value: a quote never closed, a quote or an escaped space inside, a space unquoted
        ("host=db password='SECRET PW dbname=jobs", "host=db password=***"),
        ("host=db password=SECRET'PW dbname=jobs", "host=db password=*** dbname=jobs"),
        ("host=db password=SECRET\\ PW dbname=jobs", "host=db password=*** dbname=jobs"),
        ("host=db password=SECRET PW dbname=jobs", "host=db password=*** dbname=jobs"),
    ],
)
def test_passwords_are_masked_in_urls_and_connection_strings(connection: str, shown: str) -> None:
    assert redacted(connection) == shown


def test_a_message_quoting_a_password_is_scrubbed() -> None:
    message = 'invalid connection option "pasword" near SECRETPW'
    assert scrubbed(message, "host=db password=SECRETPW") == 'invalid connection option "pasword" near ***'
    assert scrubbed("no secret here", "postgresql://app:SECRETPW@db/jobs") == "no secret here"
    # libpq ends a URL's password at its first @ and takes the rest for the host
    libpq = 'could not translate host name "SECRET2@db" to address'
    assert (
        scrubbed(libpq, "postgresql://app:SECRET1@SECRET2@db/jobs")
        == 'could not translate host name "***@db" to address'
    )
    # what libpq quotes back of a password whose space was not quoted
    unquoted = 'missing "=" after "PW-x9" in connection info string'
    assert scrubbed(unquoted, "host=db password=SECRET PW-x9 dbname=jobs") == (
        'missing "=" after "***" in connection info string'
    )


def test_the_cli_never_prints_a_password_given_in_a_connection_string() -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["show", "t1", "--database", "host=127.0.0.1 password=SECRETPW dbname=jobs"])
    assert shown.exit_code != 0 and "password=***" in shown.output and "SECRETPW" not in shown.output
    url = "postgresql://postgres:SECRETPW@127.0.0.1:1/nosuch?connect_timeout=1"  # nothing listens on port 1
    demo = runner.invoke(main, ["demo", "--database", url])
    assert (
        demo.output.splitlines()[0]
        == "demo store: postgresql://postgres:***@127.0.0.1:1/nosuch?connect_timeout=1"
    )
    assert demo.exit_code != 0 and "SECRETPW" not in demo.output


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:SECRET?PW@127.0.0.1:1/nosuch?connect_timeout=1",
        "postgresql://postgres:SECRET#PW@127.0.0.1:1/nosuch?pgbouncer=true",
        "postgresql://postgres:SECRET@PW@127.0.0.1:1/nosuch?connect_timeout=1",
        "host=127.0.0.1 port=1 password='SECRET PW dbname=nosuch",
        "sqlite://app:SECRETPW@host/x.db",
        "sqlite:///x.db?password=SECRETPW",
        "sqlite://app:SE[CRET@host/x.db",
    ],
)
def test_no_command_prints_a_password_urllib_would_misread(url: str) -> None:
    """Passwords holding ?, #, @, [ or an unclosed quote: masked in what the demo says
    of its store and in errors, as text and as JSON (nothing listens on port 1)."""
    runner = CliRunner()
    for args in (["list", "--json"], ["show", "t1"], ["demo"], ["demo", "--json"]):
        result = runner.invoke(main, [*args, "--database", url])
        assert result.exit_code != 0
        assert "SECRET" not in result.output + (result.stderr or ""), (args, result.output)


def test_settings_and_argument_errors_show_no_store_url_password(tmp_path: Path) -> None:
    url = "postgresql://app:SECRETPW@db/jobs"
    settings = Settings.from_mapping({"RUNIFOLD_DATABASE_URL": url})
    assert "SECRETPW" not in repr(settings) and "postgresql://app:***@db/jobs" in repr(settings)
    with pytest.raises(InvalidArgument) as refused:
        WorkflowWorker(url, WorkflowRegistry(), WorkerId.parse("w1"))  # type: ignore[arg-type]
    assert "SECRETPW" not in str(refused.value) and "open_store(url)" in str(refused.value)
    with pytest.raises(InvalidArgument) as mixed_up, SqliteWorkflowStore.open(tmp_path / "w.db") as store:
        WorkflowWorker(store, WorkflowRegistry(), WorkerId.parse("w1"), settings=settings)  # type: ignore[arg-type]
    assert "SECRETPW" not in str(mixed_up.value) and "got a Settings" in str(mixed_up.value)
    with pytest.raises(InvalidArgument) as sqlite_url:
        open_store("sqlite://app:SECRETPW@host/x.db")
    assert "SECRETPW" not in str(sqlite_url.value)


def test_where_a_store_points_names_no_piece_of_a_password_holding_an_at_sign() -> None:
    """libpq ends such a password at its first '@' and reads the rest as the host."""
    where = describe("postgresql://app:SECRET1@SECRET2@127.0.0.1:5999/jobs")
    assert "SECRET" not in where and where.endswith("@127.0.0.1:5999")
