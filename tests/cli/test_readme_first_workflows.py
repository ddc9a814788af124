"""The README's first workflows, run as their own programs: the smallest durable workflow
(at most 12 lines, one import line, an ``App``) prints its result, and the order workflow
of "A workflow" runs to its durable timer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support import processes

README = processes.ROOT / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_readmes_first_example_is_a_durable_workflow_in_12_lines_that_prints_its_result(
    tmp_path: Path,
) -> None:
    first = _blocks()[0]
    lines = first.strip().splitlines()
    assert len(lines) <= 12
    assert [line for line in lines if "import" in line] == ["from runifold_sync import App"]
    assert 'App("sqlite:///hello.db")' in first
    done = _run(first, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello, world\n"
    assert (tmp_path / "hello.db").exists()  # durable: the store is a file
    again = _run(first, tmp_path)  # a second task in the same store
    assert (again.returncode, again.stdout) == (0, "hello, world\n")


def test_the_readmes_order_workflow_runs_to_its_durable_timer(tmp_path: Path) -> None:
    text = README.read_text()
    section = text[text.index("## A workflow\n") :]
    block = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 20)]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Suspended(task_id='ord_42'")
