"""``python -m runifold_sync dashboard`` serves the dashboard with waitress: started as
a process on a free port, it says its URL in one JSON line, answers pages, never prints
the token, ends a login after ``--session-lifetime`` and stops on SIGTERM; a bad token
file or lifetime is a usage error naming it."""

from __future__ import annotations

import http.cookiejar
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import WorkflowTask, open_store
from runifold_sync.cli.main import main

TOKEN = "cli-token-31b9"


@pytest.mark.timeout(60)
def test_the_command_serves_the_dashboard_and_says_where(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    with open_store(url) as store:
        store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="cli-task"))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    command = [sys.executable, "-m", "runifold_sync", "dashboard", "--database", url, "--port", "0"]
    process = subprocess.Popen(
        [*command, "--token-file", str(token_file), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        said = json.loads(process.stdout.readline())
        assert said["read_only"] is False
        assert said["url"].startswith("http://127.0.0.1:")  # loopback unless told otherwise
        with urllib.request.urlopen(said["url"], timeout=10) as response:
            page = response.read().decode()
            assert response.status == 200
            assert response.headers["X-Frame-Options"] == "DENY"
            assert response.headers["Server"] == "runifold_sync"  # waitress, not werkzeug
        assert "Overview" in page
        with urllib.request.urlopen(said["url"] + "tasks/cli-task", timeout=10) as response:
            assert "cli-task" in response.read().decode()
    finally:
        process.terminate()
        out, err = process.communicate(timeout=20)
    assert TOKEN not in out + err


def test_a_token_file_that_is_missing_or_empty_is_a_usage_error(tmp_path: Path) -> None:
    runner = CliRunner()
    database = f"sqlite:///{tmp_path / 'x.db'}"
    missing = runner.invoke(
        main, ["dashboard", "--database", database, "--token-file", str(tmp_path / "nope")]
    )
    assert missing.exit_code == 2 and "cannot read" in missing.output
    empty = tmp_path / "empty"
    empty.write_text("\n")
    blank = runner.invoke(main, ["dashboard", "--database", database, "--token-file", str(empty)])
    assert blank.exit_code == 2 and "holds no token" in blank.output


def test_a_port_in_use_is_an_error_naming_it(tmp_path: Path) -> None:
    import socket

    open_store(f"sqlite:///{tmp_path / 'x.db'}").close()  # dashboard opens only a store that exists
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main, ["dashboard", "--database", f"sqlite:///{tmp_path / 'x.db'}", "--port", str(port)]
        )
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


def test_importing_runifold_sync_does_not_import_flask() -> None:
    code = "import sys, runifold_sync, runifold_sync.cli.main; print('flask' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


def _csrf(opener: urllib.request.OpenerDirector, url: str) -> str:
    with opener.open(url, timeout=10) as response:
        found = re.search(r'name="csrf_token" value="([^"]+)"', response.read().decode())
    assert found is not None, url
    return found.group(1)


def _post(opener: urllib.request.OpenerDirector, url: str, fields: dict[str, str]) -> int:
    """POST ``fields`` (the redirect after it followed); the final status."""
    data = urllib.parse.urlencode(fields).encode()
    try:
        with opener.open(url, data=data, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(60)
def test_session_lifetime_ends_a_login_after_that_much_store_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    store = open_store(url)
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="cli-task"))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    command = [sys.executable, "-m", "runifold_sync", "dashboard", "--database", url, "--port", "0"]
    process = subprocess.Popen(
        [*command, "--token-file", str(token_file), "--session-lifetime", "10m", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        base = json.loads(process.stdout.readline())["url"]
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        login = {"csrf_token": _csrf(browser, base + "login"), "token": TOKEN, "actor": "alice"}
        assert _post(browser, base + "login", login) == 200
        csrf = _csrf(browser, base + "tasks/cli-task")
        store.set_clock_offset(timedelta(minutes=9, seconds=50))
        assert _post(browser, base + "tasks/cli-task/pause", {"csrf_token": csrf, "reason": "r"}) == 200
        assert store.get_task("cli-task").paused == "paused by alice: r"
        store.set_clock_offset(timedelta(minutes=10, seconds=1))
        assert _post(browser, base + "tasks/cli-task/resume", {"csrf_token": csrf, "reason": "r"}) == 401
        assert store.get_task("cli-task").paused
    finally:
        process.terminate()
        process.communicate(timeout=20)
        store.close()


@pytest.mark.parametrize(("given", "said"), [("0s", "must be longer than 0s"), ("soon", "is not a duration")])
def test_a_session_lifetime_that_is_no_positive_duration_is_a_usage_error(
    tmp_path: Path, given: str, said: str
) -> None:
    result = CliRunner().invoke(
        main, ["dashboard", "--database", f"sqlite:///{tmp_path / 'x.db'}", "--session-lifetime", given]
    )
    assert result.exit_code == 2 and "--session-lifetime" in result.output and said in result.output
