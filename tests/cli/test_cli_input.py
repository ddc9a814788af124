"""What ``--input``, ``--payload`` and ``--result`` refuse, each in one line (exit status 2,
``{"error", "type"}`` under ``--json``) rather than a raw exception: JSON nested past
what Python's parser recurses (10,000 levels), an integer past its digit limit, a file
that is not UTF-8; and ``@FILE`` or ``-`` that go on past the input limit are read only
one byte past it (``@/dev/zero`` used to grow until the kernel killed it)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync.cli.main import main
from runifold_sync.model.values import MAX_INPUT_BYTES
from tests.support.processes import ROOT

DEEP = "[" * 10_000 + "]" * 10_000
LIMIT_LINE = (
    f"holds more than {MAX_INPUT_BYTES} bytes, the limit of a task's input; store large data outside "
    "and pass its id"
)


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)


def _refused(args: list[str], message: str, stdin: bytes | None = None) -> None:
    """``args`` exit 2 with ``message`` as the one line on stderr, and in JSON."""
    plain = _invoke(*args, stdin=stdin)
    assert (plain.exit_code, plain.stdout, plain.stderr) == (2, "", f"Error: {message}\n")
    answered = _invoke(*args, "--json", stdin=stdin)
    assert answered.exit_code == 2
    assert json.loads(answered.stdout) == {"error": message, "type": "BadValue"}


def test_json_nested_past_the_parsers_recursion_is_one_line_for_every_json_option(url: str) -> None:
    nested = "nests deeper than the 100 levels a value may"
    _refused(["enqueue", "flow", "1", "--input", DEEP, "--database", url], f"--input: {nested}")
    signal = ["signal", "t1", "go", "--signal-id", "s1", "--sender", "ops", "--database", url]
    _refused([*signal, "--payload", DEEP], f"--payload: {nested}")
    resolve = ["resolve", "t1", "t1/x#1", "--applied", "--actor", "ops", "--reason", "checked"]
    _refused([*resolve, "--result", DEEP, "--database", url], f"--result: {nested}")


def test_an_integer_past_pythons_digit_limit_is_one_line(url: str) -> None:
    _refused(
        ["enqueue", "flow", "1", "--input", "1" * 5000, "--database", url],
        "--input: holds an integer of more than 4,300 digits, which JSON text cannot carry here",
    )


def test_a_file_or_standard_input_that_is_not_utf8_is_one_line(url: str, tmp_path: Path) -> None:
    source = tmp_path / "latin1.json"
    source.write_bytes('{"city": "Zürich"}'.encode("latin-1"))
    _refused(
        ["enqueue", "flow", "1", "--input", f"@{source}", "--database", url],
        f"--input: {str(source)!r} is not UTF-8 text: invalid start byte at byte 11",
    )
    _refused(
        ["enqueue", "flow", "1", "--input", "-", "--database", url],
        "--input: standard input is not UTF-8 text: invalid start byte at byte 11",
        stdin='{"city": "Zürich"}'.encode("latin-1"),
    )


def test_input_one_byte_past_the_limit_is_refused_and_at_the_limit_is_read(url: str, tmp_path: Path) -> None:
    source = tmp_path / "big.json"
    source.write_bytes(b'"' + b"x" * (MAX_INPUT_BYTES - 1) + b'"')  # the limit plus one
    _refused(
        ["enqueue", "flow", "1", "--input", f"@{source}", "--database", url],
        f"--input: {str(source)!r} {LIMIT_LINE}",
    )
    source.write_bytes(b'"' + b"x" * (MAX_INPUT_BYTES - 2) + b'"')  # the limit itself: enqueued
    read = _invoke("enqueue", "flow", "1", "--input", f"@{source}", "--database", url, "--json")
    assert read.exit_code == 0, read.output
    assert json.loads(read.stdout)["created"] is True


def _under_a_memory_cap(*args: str, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI with its address space capped at 1 GiB: reading without a bound hits the
    cap in a second or two (a MemoryError), instead of taking the machine's memory."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "runifold_sync", *args],
        cwd=ROOT,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=cap,
    )


@pytest.mark.parametrize("given", ["@/dev/zero", "-"])
def test_an_endless_input_is_read_only_one_byte_past_the_limit(url: str, given: str) -> None:
    with open("/dev/zero", "rb") as zeros:
        done = _under_a_memory_cap(
            "enqueue", "flow", "1", "--input", given, "--database", url, stdin=zeros.fileno()
        )
    what = "'/dev/zero'" if given.startswith("@") else "standard input"
    assert (done.returncode, done.stderr) == (2, f"Error: --input: {what} {LIMIT_LINE}\n")
