"""Connection strings are printed with their passwords masked, in both forms a store
accepts, and a driver message that quotes a password is scrubbed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from runifold_sync.cli import main
from runifold_sync.redaction import redacted, scrubbed


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
    ],
)
def test_passwords_are_masked_in_urls_and_connection_strings(connection: str, shown: str) -> None:
    assert redacted(connection) == shown


def test_a_message_quoting_a_password_is_scrubbed() -> None:
    message = 'invalid connection option "pasword" near SECRETPW'
    assert scrubbed(message, "host=db password=SECRETPW") == 'invalid connection option "pasword" near ***'
    assert scrubbed("no secret here", "postgresql://app:SECRETPW@db/jobs") == "no secret here"


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
